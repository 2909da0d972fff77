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

**Load streams** (``load_stream=True``, round-robin pool schedules): a LOAD runs on its device's own
copy stream instead of in the compute order, so it overlaps the previous job's compute, as the pool
prefetches (``pool_worker.load``). The weight budget holds two jobs: the LOAD of a device's q-th job
waits until its (q-2)-th job has ended (its STORE or last forward); a job's first compute waits for its
LOAD. Without it (the shared simulator's rule) a LOAD occupies the device in order, which only hides
it in waits for input.

The steady-state bubble is ``1 - work / (devices x period)``, the period being the mean distance
between consecutive iterations' ends. What it leaves out: the optimizer's own time and an iteration
that would need weights updated two iterations back before they are (both far off the critical path
when an iteration takes many jobs per device).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .action import Kind
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
    work: float = 0.0
    """Compute of one iteration over all devices (LOADs on their own stream excluded)."""


def steady_state(schedule: Schedule, costs: Costs | None = None, *, iterations: int = 4,
                 rotate: bool | int | None = None, load_stream: bool = False) -> SteadyState:
    """Simulate ``iterations`` back-to-back iterations of ``schedule`` (see the module docstring)."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError(f"iterations must be an integer >= 2 (a period needs two iteration ends), got {iterations!r}")
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    require_complete(schedule, "steady_state")
    if load_stream and schedule.layout != "roundrobin":
        raise ValueError(f"load_stream=True models the round-robin pool's weight uploads; {schedule.name!r} has "
                         f"layout {schedule.layout!r} and no LOAD actions to overlap")
    devices = schedule.num_workers
    requires, produces, durations = action_rules(layout_of(schedule), schedule, costs)
    kinds = [[a.kind for a in row] for row in schedule.actions]
    stages = [[a.stage for a in row] for row in schedule.actions]

    def run(count: int, shift: int) -> list[float]:
        return _run(requires, produces, durations, kinds, stages, costs.comm, devices, count, shift, load_stream)

    single_ends = run(1, 0)
    makespan = single_ends[0]
    if rotate is None:
        shifts = range(devices) if schedule.stage_to_rank is None else (0,)
    elif rotate is True:
        shifts = (_shift(simulate(schedule, costs)),)
    else:
        shifts = (int(rotate) % devices,)
    period, shift = min((_period(run(iterations, s)), s) for s in shifts)
    work = sum(d for row, ks in zip(durations, kinds, strict=True) for d, k in zip(row, ks, strict=True)
               if not (load_stream and k is Kind.LOAD))
    bubble = 0.0 if makespan <= 0 else max(0.0, 1.0 - work / (devices * makespan))
    steady = 0.0 if period <= 0 else max(0.0, 1.0 - work / (devices * period))
    return SteadyState(makespan, bubble, period, steady, shift, work)


def _period(ends: list[float]) -> float:
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def _shift(timeline) -> int:
    """Rotation putting the device that starts an iteration onto the device that ends it first."""
    rows = timeline.per_worker
    starter = min((row[0].start, w) for w, row in enumerate(rows) if row)[1]
    first_free = min((row[-1].end if row else 0.0, w) for w, row in enumerate(rows))[1]
    return (first_free - starter) % len(rows)


def _items(requires, produces, durations, kinds, stages, devices, iterations, shift, load_stream):
    """Per row (devices, then their load streams when ``load_stream``): (needs, makes, duration,
    iteration) of each item in order; events tagged with the iteration, plus the budget events."""
    rows = [[] for _ in range(2 * devices if load_stream else devices)]
    for d in range(devices):
        numbers, last_item = {}, {}  # (iteration, stage) -> the job's number on this device, by first action
        compute = rows[d]
        for k in range(iterations):
            src = (d - k * shift) % devices
            for j in range(len(requires[src])):
                needs = [(k, e) for e in requires[src][j]]
                makes = [(k, e) for e in produces[src][j]]
                occurrence = numbers.setdefault((k, stages[src][j]), len(numbers))
                if load_stream and kinds[src][j] is Kind.LOAD:
                    if occurrence >= 2:
                        needs.append(("released", d, occurrence - 2))
                    rows[devices + d].append((needs, makes + [("loaded", d, occurrence)], durations[src][j], k))
                    continue
                if load_stream:
                    needs.append(("loaded", d, occurrence))
                compute.append((needs, makes, durations[src][j], k))
                last_item[occurrence] = len(compute) - 1
        if load_stream:
            loaded = {e[2] for _, makes, _, _ in rows[devices + d] for e in makes if e[0] == "loaded"}
            for q, position in last_item.items():
                compute[position][1].append(("released", d, q))
            for needs, *_ in compute:  # jobs without a LOAD (transfers off) wait for none
                needs[:] = [e for e in needs if e[0] != "loaded" or e[2] in loaded]
            for q in range(len(numbers)):
                if q not in last_item:  # a job with only its LOAD/STORE here releases at once
                    rows[devices + d].append(([], [("released", d, q)], 0.0, 0))
    return rows


def _run(requires, produces, durations, kinds, stages, comm, devices, iterations, shift, load_stream) -> list[float]:
    """The event loop of ``simulate.run_order`` over the rows of ``_items``; each iteration's end."""
    rows = _items(requires, produces, durations, kinds, stages, devices, iterations, shift, load_stream)
    happened: dict[tuple, tuple[float, int]] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    position, free_at = [0] * len(rows), [0.0] * len(rows)
    ends = [0.0] * iterations
    ready = list(range(len(rows)))
    while ready:
        row_index = ready.pop()
        row, i, free = rows[row_index], position[row_index], free_at[row_index]
        device = row_index % devices  # a load stream is its device's: no comm between them
        while i < len(row):
            needs, makes, duration, k = row[i]
            start, blocked = free, None
            for event in needs:
                seen = happened.get(event)
                if seen is None:
                    blocked = event
                    break
                start = max(start, seen[0] + (comm if seen[1] != device else 0.0))
            if blocked is not None:
                waiting[blocked].append(row_index)
                break
            free = start + duration
            if duration > 0 or row_index < devices:
                ends[k] = max(ends[k], free)
            for event in makes:
                happened[event] = (free, device)
                ready.extend(waiting.pop(event, ()))
            i += 1
        position[row_index], free_at[row_index] = i, free
    if any(position[r] < len(rows[r]) for r in range(len(rows))):
        raise ValueError(f"back-to-back iterations deadlock (rotation {shift})")
    return ends
