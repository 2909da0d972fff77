"""Several iterations of one schedule back to back: the steady state an asynchronous optimizer allows.

With RoundPipe's one-step-stale optimizer (the CPU updates iteration i's weights while iteration i+1
runs on the previous ones), nothing in iteration i+1 waits for iteration i except the devices
themselves: iteration i+1's first forward jobs start on the devices that iteration i's drain leaves
free. ``steady_state`` runs ``iterations`` copies of the schedule's per-device rows one after another
on the same event rules as ``simulate`` (events are tagged with their iteration). A pool schedule's
rows may be rotated between iterations (iteration k runs device d's rows on device d + k x shift), as
RoundPipe starts each round on the first free GPU; by default every shift is tried and the shortest
period kept (stage-bound schedules keep their ranks). Our pool executor runs steps one after another
and never rotates: these figures are what an asynchronous executor would reach.

The steady-state bubble is ``1 - work / (devices x period)``, the period being the mean distance
between consecutive iterations' ends. What it leaves out: the optimizer's own time and an iteration
that would need weights updated two iterations back before they are (both far off the critical path
when an iteration takes many jobs per device).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .costs import Costs
from .layouts import layout_of
from .schedule import Schedule
from .simulate import action_rules, check_costs, require_complete, simulate


@dataclass(frozen=True)
class SteadyState:
    """Single-iteration and steady-state figures of one schedule."""

    makespan: float
    """One iteration alone, as ``simulate`` gives it."""
    bubble: float
    """One iteration alone: idle share of makespan x devices."""
    period: float
    """Mean time between consecutive iterations' ends, back to back."""
    steady_bubble: float
    """Idle share of period x devices."""
    shift: int
    """Devices each iteration's rows are rotated by (0: not rotated)."""


def steady_state(schedule: Schedule, costs: Costs | None = None, *, iterations: int = 4,
                 rotate: bool | int | None = None) -> SteadyState:
    """Simulate ``iterations`` back-to-back iterations of ``schedule`` (see the module docstring)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError(f"iterations must be an integer >= 2 (a period needs two iteration ends), got {iterations!r}")
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    require_complete(schedule, "steady_state")
    single = simulate(schedule, costs)
    devices = schedule.num_workers
    if rotate is None:
        shifts = range(devices) if schedule.stage_to_rank is None else (0,)
    elif rotate is True:
        shifts = (_shift(single),)
    else:
        shifts = (int(rotate) % devices,)
    requires, produces, durations = action_rules(layout_of(schedule), schedule, costs)
    period, shift = min(
        (_period(_run(schedule, requires, produces, durations, costs.comm, iterations, s)), s) for s in shifts
    )
    work = sum(sum(row) for row in durations)
    steady = 0.0 if period <= 0 else max(0.0, 1.0 - work / (devices * period))
    return SteadyState(single.makespan, single.bubble_rate, period, steady, shift)


def _period(ends: list[float]) -> float:
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def _shift(timeline) -> int:
    """Rotation putting the device that starts an iteration onto the device that ends it first."""
    rows = timeline.per_worker
    starter = min((row[0].start, w) for w, row in enumerate(rows) if row)[1]
    first_free = min((row[-1].end if row else 0.0, w) for w, row in enumerate(rows))[1]
    return (first_free - starter) % len(rows)


def _run(schedule, requires, produces, durations, comm, iterations, shift) -> list[float]:
    """The event loop of ``simulate.run_order`` over rows of ``iterations`` tagged copies; each
    iteration's end time."""
    devices = schedule.num_workers
    # device d's k-th segment is source row (d - k shift) mod devices of iteration k
    plan = [[((d - k * shift) % devices, k) for k in range(iterations)] for d in range(devices)]
    flat = [[(src, k, i) for src, k in plan[d] for i in range(len(requires[src]))] for d in range(devices)]
    happened: dict[tuple, tuple[float, int]] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    position, free_at = [0] * devices, [0.0] * devices
    ends = [0.0] * iterations
    ready = list(range(devices))
    while ready:
        device = ready.pop()
        row, i, free = flat[device], position[device], free_at[device]
        while i < len(row):
            src, k, j = row[i]
            start, blocked = free, None
            for event in requires[src][j]:
                seen = happened.get((k, event))
                if seen is None:
                    blocked = (k, event)
                    break
                arrival = seen[0] + (comm if seen[1] != device else 0.0)
                start = max(start, arrival)
            if blocked is not None:
                waiting[blocked].append(device)
                break
            free = start + durations[src][j]
            ends[k] = max(ends[k], free)
            for event in produces[src][j]:
                happened[(k, event)] = (free, device)
                ready.extend(waiting.pop((k, event), ()))
            i += 1
        position[device], free_at[device] = i, free
    if any(position[d] < len(flat[d]) for d in range(devices)):
        raise ValueError(f"{schedule.name or 'schedule'}: back-to-back iterations deadlock (rotation {shift})")
    return ends
