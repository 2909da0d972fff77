"""The order of actions on each pool device: a list scheduler that fills waits with recompute.

RoundPipe runs a backward job's micro-batches strictly as R(m) B(m) R(m+1) B(m+1) ..., so a device
whose gradient for m has not arrived can only recompute m itself. Here every device decides, each time
it is free, from what has happened so far (a discrete-event run in time order):

1. the current job's next B when its gradient is already there (the critical path first; with
   ``JobTimes.weight`` the B is split and only its input half I runs here, its W waits for step 4);
2. else the current job's next F (forward and fused last jobs, in micro-batch order);
3. else, while fewer than ``ahead`` of the current job's micro-batches are recomputed but not yet
   backpropagated, the current job's next R: recompute of micro-batch m needs only m's saved input,
   so it may run long before m's gradient, in the wait for it;
4. else a deferred W of the current job (split backward only: W is off the critical path, so it fills
   gaps; a job ends, and its STORE follows, once its last W has run);
5. else the next R of the device's next backward job, whose weights the pool has prefetched
   (``pool_worker._prefetch``), within slots of its own (``max(ahead - 1, next_ahead)``; the current
   job's slots are never taken, which could deadlock the chain of gradients);
6. else wait for the earliest of those to become possible.

Jobs (one stage over all micro-batches, or over one round with ``round_size``) are dealt in execution
order to the first device that has none (at time 0: job d to device d); with ``next_ahead`` job k goes
to device k mod N instead, so a device knows its next job and can recompute it in the current job's
waits: a device whose current job waits (forward, fused or backward: a forward job paced by a larger
group upstream waits between its micro-batches too) takes its next backward job early, for its R only,
so at most two jobs' weights are ever needed on a device. Activation memory: a device holds at most
``ahead`` micro-batches of its current group and ``max(ahead - 1, next_ahead)`` of its next (1 and 0:
RoundPipe's one at a time). The simulator judges the result; this only chooses the order.

A job may be split (``parts``): its micro-batches in parts dealt as units of their own, so the job that
paces the step (often the fused last group: LM head, loss and backward over every micro-batch) runs on
two or more devices at once, each uploading the job's weights and storing its partial gradients.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from ..action import Action, Kind
from ..roundrobin_layout import PoolGroups

SPLITS = {
    "halves": lambda mbs, n: tuple(range(k * mbs // n, (k + 1) * mbs // n) for k in range(n)),
    "interleaved": lambda mbs, n: tuple(range(k, mbs, n) for k in range(n)),
}
"""How a split job's micro-batches are cut in ``n`` parts (one per device): contiguous runs, or every n-th."""


def split_parts(job: int, how: str, num_microbatches: int, count: int = 2) -> dict[int, tuple[range, ...]]:
    """``parts`` for ``list_dispatch``: ``job``'s micro-batches in ``count`` parts, ``how`` one of ``SPLITS``."""
    if not 2 <= count <= num_microbatches:
        raise ValueError(f"a job splits over 2 to num_microbatches={num_microbatches} devices, got {count}; a split "
                         f"needs 2 or more micro-batches")
    return {job: SPLITS[how](num_microbatches, count)}


@dataclass(frozen=True)
class JobTimes:
    """Per job (stage), the time of one micro-batch of each action kind."""

    forward: tuple[float, ...]
    recompute: tuple[float, ...]
    backward: tuple[float, ...]
    comm: float = 0.0
    weight: tuple[float, ...] | None = None
    """W's share of ``backward`` per job: given, gradient jobs run I (the rest) and W apart, and W waits
    (lowest priority, before the job ends) for a gap on its device."""


def list_dispatch(groups: PoolGroups, times: JobTimes, num_devices: int, num_microbatches: int,
                  ahead: int, round_size: int | None = None, next_ahead: int = 0,
                  parts: dict[int, tuple[Sequence[int], ...]] | None = None,
                  assignment: Sequence[int] | None = None,
                  ) -> tuple[list[list[Action]], float]:
    """Each device's action order (see the module docstring) and the makespan the list scheduler saw
    (at least what the simulator gives for that order: it replays each action as early as possible).

    ``parts``: job -> its micro-batches cut into parts (``split_parts``), each part a unit of its own
    dealt like any job (so usually to another device: a split job, one LOAD and STORE per device).

    ``assignment``: the device of each unit (``dispatch_units``' order), instead of dealing them; each
    device runs its units in that order (``assignment_of`` reads it back from rows)."""
    count, mbs = groups.num_stages, num_microbatches
    roles = [groups.role(j) for j in range(count)]  # read once: role() is a method call per action
    if parts and round_size is not None:
        raise ValueError("list_dispatch: parts= split whole jobs; with round_size every round is a unit already")
    units = dispatch_units(count, mbs, round_size, parts)
    feeds = []
    for job in range(count):
        if roles[job] == "backward":
            start = groups.layers(job).start
            feeds.append(groups.forward_stage_holding(start - 1) if start > 0 else None)
        else:
            feeds.append(job - 1 if job > 0 else None)
    done_f = [[None] * mbs for _ in range(count)]  # (end, device) of F per micro-batch
    done_g = [[None] * mbs for _ in range(count)]  # (end, device) of B per micro-batch
    progress = [[0, 0, 0, 0] for _ in units]  # per unit: F, R, B (or I), W done (indices into its micro-batches)
    split = times.weight is not None
    gradient = Kind.I if split else Kind.B
    taken = [[] for _ in range(num_devices)]  # the device's current unit and at most one next unit
    held = [0] * len(units)  # per unit: micro-batches recomputed but not yet backpropagated
    rows: list[list[Action]] = [[] for _ in range(num_devices)]
    comm = times.comm
    dealt = 0

    def arrival(event, device):
        if event is None:
            return None
        end, where = event
        return end + (comm if where != device else 0.0)

    def input_of(job, m, device):
        source = feeds[job]
        return 0.0 if source is None else arrival(done_f[source][m], device)

    def candidates(device):
        """(ready time or None, priority, unit, kind, micro-batch) the device may run next."""
        found = []
        if not taken[device]:
            return found
        unit = taken[device][0]
        job, mine = units[unit]
        role = roles[job]
        f, r, b, w = progress[unit]
        if split and w < b and role != "forward":  # a deferred W: ready since its I ended here
            found.append((done_g[job][mine[w]][0], 2.5, unit, Kind.W, mine[w]))
        if role != "backward":
            if role == "last" and b < f:  # the fused group: B right after its F
                found.append((done_f[job][mine[b]][0], 0, unit, gradient, mine[b]))
            elif f < len(mine):
                found.append((input_of(job, mine[f], device), 1, unit, Kind.F, mine[f]))
        else:
            if b < r:
                found.append((arrival(done_g[job - 1][mine[b]], device), 0, unit, gradient, mine[b]))
            if held[unit] < ahead and r < len(mine):
                found.append((input_of(job, mine[r], device), 2, unit, Kind.R, mine[r]))
        for other in taken[device][1:]:  # the next job: R into slots of its own (no deadlock on shared ones)
            other_job, other_mbs = units[other]
            nr = progress[other][1]
            if roles[other_job] == "backward" and nr < len(other_mbs) and held[other] < max(ahead - 1, next_ahead):
                found.append((input_of(other_job, other_mbs[nr], device), 3, other, Kind.R, other_mbs[nr]))
        return found

    # with next_ahead, jobs go k mod N, so a device knows its next job and recomputes it in its waits
    queues = [list(range(d, len(units), num_devices)) for d in range(num_devices)] if next_ahead else None
    if assignment is not None:
        assignment = list(assignment) if isinstance(assignment, (list, tuple)) else None
        if (assignment is None or len(assignment) != len(units)
                or any(isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < num_devices for d in assignment)):
            raise ValueError(f"list_dispatch: assignment= needs one device in 0..{num_devices - 1} per unit "
                             f"({len(units)} units), as a list or tuple of ints")
        queues = [[u for u, d in enumerate(assignment) if d == device] for device in range(num_devices)]

    def upcoming(device):
        if queues is not None:
            return queues[device][0] if queues[device] else None
        return dealt if dealt < len(units) else None

    def take(device) -> bool:
        nonlocal dealt
        unit = upcoming(device)
        if unit is None:
            return False
        if taken[device] and units[unit][0] == units[taken[device][0]][0]:
            return False  # two rounds of one stage never share a device's weights
        taken[device].append(unit)
        if queues is not None:
            queues[device].pop(0)
        dealt += 1
        return True

    free = [0.0] * num_devices
    heap = [(0.0, d) for d in range(num_devices)]
    waiting: set[int] = set()
    while heap:
        now, device = heapq.heappop(heap)
        if now < free[device] - 1e-12:
            continue
        if not taken[device] and not take(device):
            continue
        found = candidates(device)
        startable = [c for c in found if c[0] is not None and c[0] <= now + 1e-12]
        current = units[taken[device][0]]
        early = next_ahead > 0 or ahead > 1 and roles[current[0]] == "backward" \
            and progress[taken[device][0]][1] == len(current[1])
        if not startable and early and len(taken[device]) == 1 and upcoming(device) is not None \
                and roles[units[upcoming(device)][0]] == "backward" and take(device):
            found = candidates(device)  # recompute ahead into the next unit while this one waits
            startable = [c for c in found if c[0] is not None and c[0] <= now + 1e-12]
        if not startable:
            known = [c[0] for c in found if c[0] is not None]
            waiting.add(device)
            if known:
                heapq.heappush(heap, (max(min(known), now), device))
            continue
        _, _, unit, kind, m = min(startable, key=lambda c: (c[1], c[0]))
        waiting.discard(device)
        job = units[unit][0]
        state = progress[unit]
        if kind is Kind.F:
            state[0] += 1
            duration = times.forward[job]
        elif kind is Kind.R:
            state[1] += 1
            held[unit] += 1
            duration = times.recompute[job]
        elif kind is Kind.W:
            state[3] += 1
            if roles[job] == "backward":
                held[unit] -= 1
            duration = times.weight[job]
        else:
            state[2] += 1
            if roles[job] == "backward" and not split:
                held[unit] -= 1
            duration = times.backward[job] - (times.weight[job] if split else 0.0)
        end = now + duration
        rows[device].append(Action(job, kind, m))
        if kind is Kind.F:
            done_f[job][m] = (end, device)
        elif kind is gradient:
            done_g[job][m] = (end, device)
        current = taken[device][0]
        finished = progress[current][(3 if split else 2) if roles[units[current][0]] != "forward" else 0]
        if finished == len(units[current][1]):
            taken[device].pop(0)
        free[device] = end
        heapq.heappush(heap, (end, device))
        for other in list(waiting):  # a new event may unblock a device that waits on it
            heapq.heappush(heap, (max(end + (comm if other != device else 0.0), free[other]), other))
    if dealt < len(units) or any(taken):
        if assignment is not None:  # a given assignment may park two parts of one job on a device
            raise ValueError("list_dispatch: the assignment leaves units unfinished (two parts of one job on one "
                             "device, or a wait no order resolves); give each part of a job its own device")
        raise AssertionError("list dispatch left jobs unfinished")
    return rows, max(free)


def dispatch_units(count: int, num_microbatches: int, round_size: int | None = None,
                   parts: dict[int, tuple[Sequence[int], ...]] | None = None) -> list[tuple[int, Sequence[int]]]:
    """The units ``list_dispatch`` deals, in execution order: (job, its micro-batches)."""
    mbs = num_microbatches
    if round_size is None:
        return [(job, part) for job in range(count) for part in (parts or {}).get(job, (range(mbs),))]
    return [(job, range(r, min(r + round_size, mbs))) for r in range(0, mbs, round_size) for job in range(count)]


def assignment_of(rows: Sequence[Sequence[Action]], units: Sequence[tuple[int, Sequence[int]]]) -> tuple[int, ...]:
    """The device each unit of ``units`` (``dispatch_units``) runs on in ``rows``."""
    where = {(a.stage, a.microbatch): device for device, row in enumerate(rows) for a in row
             if a.microbatch is not None}
    return tuple(where[(job, mine[0])] for job, mine in units)
