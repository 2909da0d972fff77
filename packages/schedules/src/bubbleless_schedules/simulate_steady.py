"""Several iterations of one schedule back to back: the steady state an asynchronous optimizer allows.

With RoundPipe's one-step-stale optimizer (the CPU updates iteration i's weights while iteration i+1
runs on the previous ones), nothing in iteration i+1 waits for iteration i except the devices
themselves: iteration i+1's first forward jobs start on the devices that iteration i's drain leaves
free. ``steady_state`` runs ``iterations`` copies of the schedule's per-device rows one after another
on the same event rules as ``simulate`` (events are tagged with their iteration). A pool schedule's
devices are stateless, so each iteration may run the rows on other devices than the last (a
*placement*: the device of each row), as RoundPipe starts each round on the first free GPU. Two rules
place them, and by default both are tried and the shorter period kept (stage-bound schedules keep
their ranks):

- a fixed rotation, every shift tried: iteration k runs row d on device d + k x shift;
- **first free** (``first_free_placements``): iteration k + 1's rows, in the order one iteration
  alone starts their first compute, go to the devices in the order they end iteration k. A fixed
  shift cannot follow which device frees first: that depends on the rows each device ran before, and
  its period stays near the busiest rows' time (issue 11: 1.7B m=16, 285.7 against 275.6 of mean
  work per device; first free 282.6). It is an online rule: each device, as it ends iteration k, takes
  the next row of iteration k + 1 not yet taken, so an executor can follow it without knowing the
  future (with ``load_stream``, a device's first LOAD of iteration k + 1 may start before it ends
  iteration k: it then needs the order in which the devices end it a job ahead, which the simulated
  plan gives; ``cross_iteration_prefetch=False`` holds that LOAD until the device has ended iteration k,
  which an executor that learns a device's next row only when the device frees can follow).

``RoundRobinPipeline.steps`` (the asynchronous optimizer) overlaps steps by the first-free rule, learns
a device's next row when it frees and runs two steps at once at most (step k + 2 is launched once step k
has ended): ``rotate=True, load_stream=True, cross_iteration_prefetch=False, max_in_flight=2`` models it
(less the caller's hand-off between steps). ``RoundRobinPipeline.step`` runs steps one after another.

**Load streams** (``load_stream=True``, round-robin pool schedules): a LOAD runs on its device's own
copy stream instead of in the compute order, so it overlaps the previous job's compute, as the pool
prefetches (``pool_worker.load``), across iterations too unless ``cross_iteration_prefetch=False``
(then a device's first LOAD of iteration k + 1 waits until its compute row has ended iteration k,
its STOREs included; later LOADs of k + 1 still overlap k + 1's compute). The weight budget holds two jobs: a job's weights go when its last
action on the device ends (its STORE or last forward), and the LOAD of a device's q-th job waits until
q - 1 of its earlier jobs have ended, in whatever order the device ends them; a job's first compute
waits for its LOAD. Without it (the shared simulator's rule) a LOAD occupies the device in order, which
only hides it in waits for input.

The steady-state bubble is ``1 - work / (devices x period)``, the period being the mean distance
between consecutive iterations' ends after the fill, over an even number of them (``_period_span``:
iterations may end in pairs with two in flight). What it leaves out: the optimizer's own time and an iteration
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
from .simulate import action_rules, check_costs, require_complete


@dataclass(frozen=True)
class SteadyState:
    """Single-iteration and steady-state figures of one schedule."""

    makespan: float
    """One iteration alone, as ``simulate`` gives it."""
    bubble: float
    """One iteration alone: idle share of makespan x devices."""
    period: float
    """Mean time between consecutive iterations' ends, back to back, after the fill (``_period_span``)."""
    steady_bubble: float
    """Idle share of period x devices."""
    shift: int | None
    """Devices each iteration's rows are rotated by (0: not rotated); None when the first-free rule won."""
    work: float = 0.0
    """Compute of one iteration over all devices (LOADs on their own stream excluded)."""
    placements: tuple[tuple[int, ...], ...] = ()
    """Per iteration, the device that runs each row of the schedule (row d of iteration 0 on device d)."""


def steady_state(schedule: Schedule, costs: Costs | None = None, *, iterations: int = 4,
                 rotate: bool | int | None = None, load_stream: bool = False,
                 cross_iteration_prefetch: bool = True, max_in_flight: int | None = None) -> SteadyState:
    """Simulate ``iterations`` back-to-back iterations of ``schedule`` (see the module docstring).
    ``rotate``: None tries every fixed shift and the first-free rule (stage-bound schedules: no shift), True
    the first-free rule alone, an int that fixed shift alone. ``cross_iteration_prefetch`` (with
    ``load_stream``): whether a device's first LOAD of an iteration may start before the device has ended
    the iteration before; without ``load_stream`` every LOAD is in the compute order, so it never does.
    ``max_in_flight``: the most iterations running at once (iteration k + n starts on no device before
    iteration k has ended on every device); None: no bound."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError(f"iterations must be an integer >= 2 (a period needs two iteration ends), got {iterations!r}")
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    require_complete(schedule, "steady_state")
    if load_stream and schedule.layout != "roundrobin":
        raise ValueError(f"load_stream=True models the round-robin pool's weight uploads; {schedule.name!r} has "
                         f"layout {schedule.layout!r} and no LOAD actions to overlap")
    if not isinstance(cross_iteration_prefetch, bool):
        raise ValueError(f"cross_iteration_prefetch must be True or False, got {cross_iteration_prefetch!r}")
    if max_in_flight is not None and (isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int)
                                      or max_in_flight < 1):
        raise ValueError(f"max_in_flight must be None (no bound) or a positive integer, got {max_in_flight!r}")
    if not (rotate is None or isinstance(rotate, (bool, int))):
        raise ValueError(f"rotate must be None (try every shift and the first-free rule), True (first free alone) "
                         f"or an integer shift, got {rotate!r}")
    if rotate is not None and rotate is not False and rotate != 0 and schedule.stage_to_rank is not None:
        raise ValueError(f"rotate={rotate!r} re-places rows on other devices, which only a round-robin pool can do; "
                         f"{schedule.name!r} pins its stages to ranks: pass rotate=None, False or 0")
    devices = schedule.num_workers
    requires, produces, durations = action_rules(layout_of(schedule), schedule, costs)
    kinds = [[a.kind for a in row] for row in schedule.actions]
    stages = [[a.stage for a in row] for row in schedule.actions]

    runs: dict[tuple, _Run] = {}  # placements -> their run: the first-free rule asks again for ones it has

    def run(placements) -> _Run:
        key = tuple(placements)
        if key not in runs:
            runs[key] = _run(requires, produces, durations, kinds, stages, costs.comm, key, load_stream,
                             load_stream and not cross_iteration_prefetch, max_in_flight)
        return runs[key]

    makespan = run([tuple(range(devices))]).ends[0]
    if rotate is None:
        shifts = range(devices) if schedule.stage_to_rank is None else (0,)
    else:
        shifts = () if rotate is True else (int(rotate) % devices,)
    tried = [(_period(run(placements).ends), shift, placements)
             for shift, placements in [(s, _shifted(devices, iterations, s)) for s in shifts]]
    if (rotate is None and schedule.stage_to_rank is None) or rotate is True:
        placements = first_free_placements(run, devices, iterations)
        tried.append((_period(run(placements).ends), None, placements))
    period, shift, placements = min(tried, key=lambda t: t[0])  # the first on a tie: shifts before first free
    work = sum(d for row, ks in zip(durations, kinds, strict=True) for d, k in zip(row, ks, strict=True)
               if not (load_stream and k is Kind.LOAD))
    bubble = 0.0 if makespan <= 0 else max(0.0, 1.0 - work / (devices * makespan))
    steady = 0.0 if period <= 0 else max(0.0, 1.0 - work / (devices * period))
    return SteadyState(makespan, bubble, period, steady, shift, work, tuple(placements))


def pool_steady_state(schedule: Schedule, costs: Costs | None = None, *, iterations: int = 4,
                      load_stream: bool = False) -> SteadyState:
    """``steady_state`` as ``RoundRobinPipeline.steps`` runs back-to-back steps: rows dealt first free, two
    steps in flight, and with ``load_stream`` (a GPU's copy stream) no upload of a device's next row before
    the device has ended its current one."""
    return steady_state(schedule, costs, iterations=iterations, rotate=True, load_stream=load_stream,
                        cross_iteration_prefetch=False, max_in_flight=2)


def first_free_placements(run, devices: int, iterations: int) -> list[tuple[int, ...]]:
    """The first-free rule: iteration 0 runs row d on device d; iteration k + 1 deals the rows, in the order
    ``run`` of one iteration starts their first compute, to the devices in the order they end iteration k
    (ties: the lower row, the lower device). ``run(placements)`` simulates those iterations (``_Run``)."""
    alone = run([tuple(range(devices))])
    rows = sorted(range(devices), key=lambda r: (alone.first_compute[0][r], r))

    def dealt(frees: list[float]) -> tuple[int, ...]:
        order = sorted(range(devices), key=lambda d: (frees[d], d))
        placement = [0] * devices
        for row, device in zip(rows, order, strict=True):
            placement[row] = device
        return tuple(placement)

    placements = [tuple(range(devices))]
    while len(placements) < iterations:
        guessed = _continued(placements, iterations)
        frees = run(guessed).frees
        for k in range(len(placements), iterations):  # iteration k's placement needs k - 1's frees alone
            placements.append(dealt(frees[k - 1]))
            if placements[k] != guessed[k]:
                break  # the runs from here on went on a wrong guess: run again from the placements known
    return placements


def _continued(placements: list, iterations: int) -> list:
    """``placements`` continued to ``iterations`` by repeating their last step, for ``first_free_placements``
    to try in one run: once the rule settles, each iteration deals row r to the device that ran one fixed
    row ``step[r]`` of the iteration before (the devices end an iteration in the order of the rows they ran),
    so the guess is ``next[r] = last[step[r]]`` with ``step`` read off the last two placements. An
    iteration's times depend on it and the ones before alone (a device runs its rows in iteration order,
    and every event that holds an iteration back is an earlier one's), so the placements that the run's
    frees confirm, each equal to its guess, are exactly those one run per iteration would find."""
    guessed = list(placements)
    if len(guessed) < 2:
        return guessed + [guessed[-1]] * (iterations - len(guessed))
    before, last = guessed[-2], guessed[-1]
    row_on = {device: row for row, device in enumerate(before)}
    step = [row_on[device] for device in last]  # last[r] ran row step[r] in the iteration before
    while len(guessed) < iterations:
        guessed.append(tuple(guessed[-1][step[r]] for r in range(len(step))))
    return guessed


def _shifted(devices: int, iterations: int, shift: int) -> list[tuple[int, ...]]:
    return [tuple((row + k * shift) % devices for row in range(devices)) for k in range(iterations)]


def _period(ends: list[float]) -> float:
    """Mean distance between iteration ends over the last ``_period_span`` of them."""
    span = _period_span(len(ends))
    return (ends[-1] - ends[-1 - span]) / span


def _period_span(iterations: int) -> int:
    """How many iteration ends back ``_period`` measures from the last: an even count, from iteration 1 on
    (4 or more iterations; all of them with fewer). With two iterations in flight a plan may end them in
    pairs, and an odd span then counts half a pair too few: one job per device on 2 devices, 4 iterations,
    ends at 705, 705, 1410, 1410 gave (1410 - 705) / 3 = 235, a third of the one-iteration time, where two
    devices end two iterations per 705 (period 352.5). Iteration 0's end is not an anchor either: it is
    the fill, iteration 1 having run on the devices it left free alone."""
    if iterations < 4:
        return iterations - 1
    return 2 * ((iterations - 2) // 2)


@dataclass(frozen=True)
class _Run:
    """Back-to-back iterations simulated: per iteration, its end; per iteration and device, when its compute
    there ends (``frees``); per iteration and row of the schedule, when that row's first compute (not a LOAD
    or STORE) starts (``first_compute``)."""

    ends: list[float]
    frees: list[list[float]]
    first_compute: list[list[float]]


_TRANSFERS = (Kind.LOAD, Kind.STORE)


def _items(requires, produces, durations, kinds, stages, placements, load_stream, loads_wait_for_free, in_flight):
    """Per row (devices, then their load streams when ``load_stream``): (needs, makes, duration, iteration,
    row of the schedule or None for a transfer) of each item in order; events tagged with the iteration,
    plus the weight budget's and those that hold iterations back (``_hold_iterations``)."""
    devices = len(requires)
    rows = [[] for _ in range(2 * devices if load_stream else devices)]
    sources = [{device: row for row, device in enumerate(placement)} for placement in placements]
    for d in range(devices):
        jobs = ([], [])  # per item of the compute row, then of the load stream: its (iteration, stage)
        for k, source in enumerate(sources):
            src = source[d]
            for j in range(len(requires[src])):
                on_stream = load_stream and kinds[src][j] is Kind.LOAD
                needs = [(k, e) for e in requires[src][j]]
                makes = [(k, e) for e in produces[src][j]]
                row = None if kinds[src][j] in _TRANSFERS else src
                rows[devices + d if on_stream else d].append((needs, makes, durations[src][j], k, row))
                jobs[on_stream].append((k, stages[src][j]))
        if load_stream:
            _weight_budget(rows[d], rows[devices + d], *jobs, d)
    if loads_wait_for_free or in_flight is not None:
        _hold_iterations(rows, devices, loads_wait_for_free, in_flight)
    return rows


_FREE = "free"
"""Tag of the event "device d has ended iteration k" (its compute row's last item of k): a device learns
of another's without a hand-off, so waiting for it costs no ``comm``."""


def _hold_iterations(rows: list, devices: int, loads_wait_for_free: bool, in_flight: int | None) -> None:
    """Add the events that hold iterations back (``steady_state``'s ``cross_iteration_prefetch=False`` and
    ``max_in_flight``): each device's first LOAD of an iteration waits until its compute row has ended the
    last iteration before it that ran anything there; each device's first item of iteration k (on either
    row) waits until every device has ended iteration k - ``in_flight``."""
    ended = {}  # iteration -> the devices whose compute row runs something of it
    for device in range(devices):
        last = {item[3]: position for position, item in enumerate(rows[device])}
        for k, position in last.items():
            rows[device][position][1].append((_FREE, device, k))
            ended.setdefault(k, []).append(device)
    for index, row in enumerate(rows):
        device, is_load_stream = index % devices, index >= devices
        seen = set()
        for needs, _, _, k, _ in row:
            if k in seen:
                continue
            seen.add(k)
            if is_load_stream and loads_wait_for_free:
                earlier = [j for j in ended if j < k and device in ended[j]]
                if earlier:
                    needs.append((_FREE, device, max(earlier)))
            if in_flight is not None and k - in_flight in ended:
                needs.extend((_FREE, other, k - in_flight) for other in ended[k - in_flight])


def _weight_budget(compute: list, loads: list, compute_jobs: list, load_jobs: list, device: int) -> None:
    """Add the events of two jobs' weights on ``device``: a job's compute waits for its LOAD, its last
    action here releases its weights, and the q-th LOAD waits until q - 1 of the jobs loaded before it
    have released theirs, whichever they are: a device may end a later-started job first (a split
    backward's W), and the pool then loads the next job into the room that job leaves. A job with only
    its LOAD here holds nothing after it."""
    last = {job: position for position, job in enumerate(compute_jobs)}
    loaded = [job for job in load_jobs if job in last]
    number = {job: q for q, job in enumerate(loaded)}
    released = sorted(loaded, key=last.__getitem__)  # jobs in the order the compute row ends them
    for (needs, makes, *_), job in zip(loads, load_jobs, strict=True):
        makes.append(("loaded", device, job))
        if number.get(job, 0) >= 2:
            needs.append(("released", device, released[number[job] - 2]))
    waits_for_load = set(loaded)
    for position, ((needs, makes, *_), job) in enumerate(zip(compute, compute_jobs, strict=True)):
        if job in waits_for_load:  # jobs without a LOAD (transfers off) wait for none
            needs.append(("loaded", device, job))
            if last[job] == position:
                makes.append(("released", device, job))


def _run(requires, produces, durations, kinds, stages, comm, placements, load_stream, loads_wait_for_free,
         in_flight) -> _Run:
    """The event loop of ``simulate.run_order`` over the rows of ``_items``."""
    rows = _items(requires, produces, durations, kinds, stages, placements, load_stream, loads_wait_for_free,
                  in_flight)
    devices, iterations = len(requires), len(placements)
    happened: dict[tuple, tuple[float, int]] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    position, free_at = [0] * len(rows), [0.0] * len(rows)
    ends = [0.0] * iterations
    frees = [[0.0] * devices for _ in range(iterations)]
    first_compute = [[float("inf")] * devices for _ in range(iterations)]
    ready = list(range(len(rows)))
    while ready:
        row_index = ready.pop()
        row, i, free = rows[row_index], position[row_index], free_at[row_index]
        device = row_index % devices  # a load stream is its device's: no comm between them
        while i < len(row):
            needs, makes, duration, k, source = row[i]
            start, blocked = free, None
            for event in needs:
                seen = happened.get(event)
                if seen is None:
                    blocked = event
                    break
                start = max(start, seen[0] + (comm if seen[1] != device and event[0] != _FREE else 0.0))
            if blocked is not None:
                waiting[blocked].append(row_index)
                break
            free = start + duration
            if duration > 0 or row_index < devices:
                ends[k] = max(ends[k], free)
            if row_index < devices:
                frees[k][device] = max(frees[k][device], free)
                if source is not None:
                    first_compute[k][source] = min(first_compute[k][source], start)
            for event in makes:
                happened[event] = (free, device)
                ready.extend(waiting.pop(event, ()))
            i += 1
        position[row_index], free_at[row_index] = i, free
    if any(position[r] < len(rows[r]) for r in range(len(rows))):
        raise ValueError(f"back-to-back iterations deadlock (placements {placements})")
    for k in range(1, iterations):  # a device with no compute in iteration k is free when it was before
        frees[k] = [max(now, before) for now, before in zip(frees[k], frees[k - 1], strict=True)]
    return _Run(ends, frees, first_compute)
