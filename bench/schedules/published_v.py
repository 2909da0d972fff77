"""Independent references for V-Half, V-Min and V-ZB: the PCM building-block search and the greedy.

Written from ``shared/reference/schedule-algorithms.md`` alone (section "V-Half and V-Min (PCM)"),
never from ``bubbleless_schedules.generators``: only the IR (``Schedule``, ``Action``, ``Kind``,
``v_placement``) and the shared simulator are imported, so ours and these are judged under the same
rules. Handcrafted ZB-V, sail-sg's greedy zbv and DualPipeV live in ``published_v_zbv.py``.

Notation of the page: on device i, ``F`` is chunk 0's forward (stage i), ``f`` chunk 1's forward
(stage 2p-1-i), ``B`` chunk 1's input-gradient backward, ``b`` chunk 0's, ``w``/``W`` the weight
gradients of chunk 1 / chunk 0. One slot = one chunk pass at unit cost.

**Block search** (sail-sg ``v_auto_schedule``, as described): a block fixes device 0's residues of
f, B, b modulo 6 relative to F (5 x 4 x 3 = 60 starting patterns) and per-device offsets (k, -1, k, -1)
for (F, f, B, b), the first ``len0`` device steps with k0 and the rest with k1 (k in 1..5); every pass
takes the first slot of its residue after its inputs, each W the first free residue after its
backward. The block repeats every 6 slots for m' = max(m, 2p) micro-batches; each device's order is
its slots sorted; then the reorder ("squeeze") step: a list execution under the true costs that may
run a later pass of the order early when the next one is not ready, without raising the order's
peak memory (nor the limit); extra micro-batches are dropped. Blocks are kept per peak memory and
ranked by their length in slots; the 12 shortest that fit ``min(2p, 2 x limit)`` chunk activations are
timed (upstream times every block, 0.2-15 s; the ranking prunes that to well under a second).
At unit costs it does not reach the page's closed form b(M) for p=4, m=8, M=6 chunks (26.5): it gives
27.5, as ours does (``__main__`` prints both; the gap is rank 0's warm-up and cool-down idle).

**Greedy** (sail-sg ``zbv_greedy``, as described): the stable slot patterns (V-Min: F at i, f at
2p-i-1, B at 2p+d+i, b at 4p+d-i-1, d = 2 if p%3==0 else 0; V-Half: F at 2i, f at 3p-i-2, B at
3p+d+2i-1, b at 6p+d-i-2, d = 3 if p even else 0), micro-batch k at pattern + 6k; empty slots filled
with pending W (FIFO); a sweep in time order moves every pass to the earliest free slot after its
inputs when the device's peak does not grow; then W stripped, the sweep repeated without W, W
re-inserted from two queues (chunk 1, chunk 0) into empty slots, and real times computed from the
true costs by the simulator. Reproduces V-Min p=8, m=16 at unit costs: bubble .2195 (the page's
greedy figure; the block search gives .1933 there).
"""

from __future__ import annotations

import heapq
from collections import deque
from functools import cache

from bubbleless_schedules import Action, Costs, Kind, Schedule, peak_memory, simulate, v_placement

EPS = 1e-9


# -- common: passes, orders, execution -------------------------------------------------------------------
def stage_of(p: int, device: int, chunk: int) -> int:
    return device if chunk == 0 else 2 * p - 1 - device


def as_schedule(p: int, m: int, rows, name: str) -> Schedule:
    return Schedule([list(r) for r in rows], num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p),
                    name=name)


def drop_extra(rows, m: int):
    return [[a for a in row if a.microbatch < m] for row in rows]


def _inputs(a: Action, n: int):
    """The events ``a`` needs, as (kind, stage, mb) keys of ``execute``'s ``done``."""
    s, k = a.stage, a.microbatch
    if a.kind is Kind.F:
        return [] if s == 0 else [("F", s - 1, k)]
    if a.kind is Kind.I:
        return [("F", s, k)] + ([] if s == n - 1 else [("I", s + 1, k)])
    return [("I", s, k)]


def execute(p: int, rows, costs: Costs, cap_chunks: float, window: int):
    """List execution of ``rows`` (one order per device) under ``costs``: a device that falls free runs
    the first pass of its remaining order that is ready, looking at most ``window`` passes ahead and
    never past an earlier pass of the same kind and stage, and a forward only while the device holds
    fewer than ``cap_chunks`` chunk activations. ``window=1`` is the order executed as is. Returns the
    orders as run, or None on a deadlock."""
    n = 2 * p
    rank = [s if s < p else n - 1 - s for s in range(n)]
    comm = float(costs.comm)
    done: dict[tuple, tuple[float, int]] = {}
    left = [deque(r) for r in rows]
    free = [0.0] * p
    held = [0] * p
    out: list[list[Action]] = [[] for _ in range(p)]
    heap = [(0.0, r) for r in range(p)]
    waiting = sum(len(r) for r in rows)
    while heap:
        now, r = heapq.heappop(heap)
        if now < free[r] - EPS or not left[r]:
            continue
        chosen, future, seen = None, None, set()
        for j, a in enumerate(left[r]):
            if j >= window:
                break
            key = (a.kind, a.stage)
            if key in seen:
                continue
            seen.add(key)
            t, ok = free[r], True
            for event in _inputs(a, n):
                got = done.get(event)
                if got is None:
                    ok = False
                    break
                t = max(t, got[0] + (comm if got[1] != r else 0.0))
            if not ok or (a.kind is Kind.F and held[r] + 1 > cap_chunks + EPS):
                continue
            if t <= now + EPS:
                chosen = j
                break
            future = t if future is None else min(future, t)
        if chosen is None:
            if future is not None:
                heapq.heappush(heap, (future, r))
            continue
        a = left[r][chosen]
        del left[r][chosen]
        end = now + costs.of(a.kind, a.stage, 2)
        done[(a.kind.value, a.stage, a.microbatch)] = (end, r)
        held[r] += 1 if a.kind is Kind.F else -1 if a.kind is Kind.W else 0
        out[r].append(a)
        free[r] = end
        waiting -= 1
        heapq.heappush(heap, (end, r))
        for other in {rank[a.stage - 1] if a.stage > 0 else r, rank[a.stage + 1] if a.stage < n - 1 else r}:
            if other != r:
                heapq.heappush(heap, (end + comm, other))
    return out if waiting == 0 else None


def timed(schedule: Schedule, costs: Costs) -> float:
    return simulate(schedule, costs).makespan


def fastest_fitting(candidates, costs: Costs, limit_m_b: float, nothing: str) -> Schedule:
    """The fastest of ``candidates`` within ``limit_m_b`` M_B per rank; ValueError ``nothing`` if none fits."""
    best = None
    for schedule in candidates:
        if not fits(schedule, limit_m_b):
            continue
        span = timed(schedule, costs)
        if best is None or span < best[0] - EPS:
            best = (span, schedule)
    if best is None:
        raise ValueError(nothing)
    return best[1]


def fits(schedule: Schedule, limit_m_b: float | None) -> bool:
    return limit_m_b is None or max(peak_memory(schedule)) <= limit_m_b + EPS


# -- the PCM building block ----------------------------------------------------------------------------
def _first_at(earliest: int, residue: int) -> int:
    return earliest + (residue - earliest) % 6


def block_times(p: int, pattern: tuple[int, int, int], k0: int, k1: int, len0: int):
    """Slot times of one micro-batch: ``{(kind, chunk): [slot per device]}`` or None when two passes of
    a device share a residue. kind 'F' forward, 'B' input-gradient, 'W' weight-gradient."""
    pf, pb1, pb0 = pattern
    step = [k0 if i <= len0 else k1 for i in range(p)]  # step[i]: offset from device i-1 to i
    fwd0 = [0] * p
    for i in range(1, p):
        fwd0[i] = fwd0[i - 1] + step[i]
    f1_last = _first_at(fwd0[p - 1] + 1 + (p - 1), pf) - (p - 1)  # f on device p-1, device 0's residue pf
    fwd1 = [f1_last + (p - 1 - i) for i in range(p)]
    bwd1 = [_first_at(fwd1[0] + 1, pb1)]
    for i in range(1, p):
        bwd1.append(bwd1[-1] + step[i])
    b0_last = _first_at(bwd1[p - 1] + 1 + (p - 1), pb0) - (p - 1)
    bwd0 = [b0_last + (p - 1 - i) for i in range(p)]
    w1, w0 = [], []
    for i in range(p):
        used = {fwd0[i] % 6, fwd1[i] % 6, bwd1[i] % 6, bwd0[i] % 6}
        if len(used) < 4:
            return None
        t = bwd1[i] + 1
        while t % 6 in used:
            t += 1
        used.add(t % 6)
        w1.append(t)
        t = bwd0[i] + 1
        while t % 6 in used:
            t += 1
        w0.append(t)
    return {("F", 0): fwd0, ("F", 1): fwd1, ("B", 1): bwd1, ("B", 0): bwd0, ("W", 1): w1, ("W", 0): w0}


def steady_peak(p: int, times) -> int:
    """Chunk activations a device holds at most when the block repeats every 6 slots (F to end of W)."""
    worst = 0
    for i in range(p):
        spans = [(times[("F", c)][i], times[("W", c)][i] + 1) for c in (0, 1)]
        for t in range(6):
            held = sum(-((t - e) // 6) + ((t - a) // 6) for a, e in spans)
            worst = max(worst, held)
    return worst


@cache
def all_blocks(p: int) -> tuple[tuple[int, int, tuple], ...]:
    """(steady peak, length in slots, times) of every distinct valid block, shortest first."""
    seen, found = set(), []
    residues = range(1, 6)
    for pf in residues:
        for pb1 in residues:
            for pb0 in residues:
                if len({pf, pb1, pb0}) < 3:
                    continue
                for k0 in range(1, 6):
                    for k1 in range(1, 6):
                        for len0 in range(1, max(2, p)):
                            if k0 == k1 and len0 > 1:
                                continue  # one k: len0 does not matter
                            times = block_times(p, (pf, pb1, pb0), k0, k1, len0)
                            if times is None:
                                continue
                            key = tuple(tuple(v) for v in times.values())
                            if key in seen:
                                continue
                            seen.add(key)
                            length = max(max(v) for v in times.values()) + 1
                            found.append((steady_peak(p, times), length, key))
    found.sort(key=lambda x: (x[1], x[0]))
    return tuple(found)


_KEYS = (("F", 0), ("F", 1), ("B", 1), ("B", 0), ("W", 1), ("W", 0))
_KIND = {"F": Kind.F, "B": Kind.I, "W": Kind.W}


def repeated_orders(p: int, m: int, key) -> list[list[Action]]:
    """Each device's order when the block repeats every 6 slots for ``m`` micro-batches."""
    rows: list[list[tuple[int, Action]]] = [[] for _ in range(p)]
    for (kind, chunk), slots in zip(_KEYS, key, strict=True):
        for i, t in enumerate(slots):
            stage = stage_of(p, i, chunk)
            for k in range(m):
                rows[i].append((t + 6 * k, Action(stage, _KIND[kind], k)))
    return [[a for _, a in sorted(row, key=lambda x: x[0])] for row in rows]


def block_search(p: int, m: int, costs: Costs, limit_m_b: float | None, name: str = "pcm-block",
                 tries: int = 12) -> Schedule:
    """The fastest repeated block under ``costs`` whose schedule fits min(p, limit) M_B."""
    cap = 2 * p if limit_m_b is None else min(2 * p, int(2 * limit_m_b + EPS))
    m_rep = max(m, 2 * p)
    fitting = [b for b in all_blocks(p) if b[0] <= cap]
    if not fitting:
        raise ValueError(f"no building block fits {cap} chunk activations at p={p}")

    def candidates():
        for _, _, key in fitting[:tries]:
            plain = drop_extra(repeated_orders(p, m_rep, key), m)
            plain_s = as_schedule(p, m, plain, name)
            peak_chunks = 2 * max(peak_memory(plain_s))
            if peak_chunks <= cap + EPS:
                yield plain_s
            for window in (3, 8):
                rows = execute(p, plain, costs, min(cap, max(peak_chunks, 2)), window)
                if rows is not None:
                    yield as_schedule(p, m, rows, name)

    return fastest_fitting(candidates(), costs, cap / 2,
                           f"no building block schedule fits {cap} chunk activations at p={p}, m={m}")


# -- the greedy over stable patterns (zbv_greedy) -----------------------------------------------------------
def stable_pattern(p: int, kind: str) -> dict[tuple[str, int], list[int]]:
    if kind == "v-min":
        d = 2 if p % 3 == 0 else 0
        return {("F", 0): [i for i in range(p)], ("F", 1): [2 * p - i - 1 for i in range(p)],
                ("B", 1): [2 * p + d + i for i in range(p)], ("B", 0): [4 * p + d - i - 1 for i in range(p)]}
    d = 3 if p % 2 == 0 else 0
    return {("F", 0): [2 * i for i in range(p)], ("F", 1): [3 * p - i - 2 for i in range(p)],
            ("B", 1): [3 * p + d + 2 * i - 1 for i in range(p)], ("B", 0): [6 * p + d - i - 2 for i in range(p)]}


def _grid_peak(cells: dict[int, tuple], b_frees: bool = False) -> int:
    """Peak chunk activations of a device's slots; ``b_frees`` while W are stripped (W right after B)."""
    held = peak = 0
    for t in sorted(cells):
        kind = cells[t][0]
        held += 1 if kind == "F" else -1 if kind == "W" or (b_frees and kind == "B") else 0
        peak = max(peak, held)
    return peak


def _fill_w(p: int, grid: list[dict[int, tuple]], two_queues: bool) -> None:
    """Put each backward's W into the first empty slot of its device after it (FIFO; with
    ``two_queues`` the older head of the chunk-1 and chunk-0 queues), the rest at the end."""
    for i in range(p):
        cells = grid[i]
        backs = sorted((t, c) for t, c in cells.items() if c[0] == "B")
        queues = {0: deque(), 1: deque()}
        order = deque()
        j = 0
        t = min(cells) if cells else 0
        last = max(cells) if cells else 0
        while j < len(backs) or any(queues.values()):
            while j < len(backs) and backs[j][0] < t:
                _, (_, chunk, k) = backs[j]
                queues[chunk if two_queues else 0].append((chunk, k, backs[j][0]))
                order.append((chunk, k))
                j += 1
            if t not in cells and any(queues.values()):
                heads = [q[0] for q in queues.values() if q]
                chunk, k, _ = min(heads, key=lambda h: (h[2], -h[0]))
                q = queues[chunk if two_queues else 0]
                q.popleft()
                cells[t] = ("W", chunk, k)
            t += 1
            if t > last + 12 * p * 6 + 6 * len(backs):
                raise AssertionError("W filling did not end")


def _deps_slot(p: int, grid_at, kind: str, chunk: int, i: int, k: int) -> int:
    """Earliest slot a pass may take, given where its inputs are (unit slots, no comm)."""
    where = grid_at
    if kind == "F":
        if chunk == 0:
            return 0 if i == 0 else where[("F", 0, i - 1, k)] + 1
        return where[("F", 0, p - 1, k)] + 1 if i == p - 1 else where[("F", 1, i + 1, k)] + 1
    if kind == "B" and chunk == 1:
        return where[("F", 1, 0, k)] + 1 if i == 0 else max(where[("B", 1, i - 1, k)], where[("F", 1, i, k)]) + 1
    if kind == "B":
        first = where[("B", 1, p - 1, k)] if i == p - 1 else where[("B", 0, i + 1, k)]
        return max(first, where[("F", 0, i, k)]) + 1
    return where[("B", chunk, i, k)] + 1


def _sweep(p: int, grid: list[dict[int, tuple]], b_frees: bool = False) -> None:
    """In time order, move each F/B to the earliest free slot after its inputs if its device's peak does
    not grow."""
    where = {}
    for i, cells in enumerate(grid):
        for t, (kind, chunk, k) in cells.items():
            where[(kind, chunk, i, k)] = t
    items = sorted(((t, i, c) for i, cells in enumerate(grid) for t, c in cells.items() if c[0] != "W"))
    peaks = [_grid_peak(cells, b_frees) for cells in grid]
    for t, i, (kind, chunk, k) in items:
        t = where[(kind, chunk, i, k)]
        earliest = _deps_slot(p, where, kind, chunk, i, k)
        cells = grid[i]
        for s in range(earliest, t):
            if s in cells:
                continue
            del cells[t]
            cells[s] = (kind, chunk, k)
            if _grid_peak(cells, b_frees) <= peaks[i]:
                where[(kind, chunk, i, k)] = s
                break
            del cells[s]
            cells[t] = (kind, chunk, k)


def greedy(p: int, m: int, costs: Costs, limit_m_b: float | None, kind: str, strip: bool = False) -> Schedule:
    """sail-sg's greedy V-Min / V-Half; raises ValueError when it does not fit ``limit_m_b``."""
    pattern = stable_pattern(p, kind)
    grid: list[dict[int, tuple]] = [{} for _ in range(p)]
    for (k_, chunk), slots in pattern.items():
        for i, t in enumerate(slots):
            for k in range(m):
                grid[i][t + 6 * k] = (k_, chunk, k)
    _fill_w(p, grid, two_queues=False)
    _sweep(p, grid)
    weights = [[(t, c) for t, c in cells.items() if c[0] == "W"] for cells in grid]
    for cells in grid:
        for t in [t for t, c in cells.items() if c[0] == "W"]:
            del cells[t]
    if strip:
        _sweep(p, grid, b_frees=True)
    rows = []
    for i, cells in enumerate(grid):
        # the W go back where the filled grid had them, chunk 1's queue before chunk 0's on a tie;
        # the simulator then squeezes the order under the true costs
        timed_ops = [(t, 0, c) for t, c in cells.items()] + [(t, 2 - c[1], c) for t, c in weights[i]]
        timed_ops.sort(key=lambda x: (x[0], x[1]))
        rows.append([Action(stage_of(p, i, c), _KIND[kd], k) for _, _, (kd, c, k) in timed_ops])
    schedule = as_schedule(p, m, rows, f"greedy-{kind}")
    if not fits(schedule, limit_m_b):
        raise ValueError(f"greedy {kind} needs {max(peak_memory(schedule)):g} M_B, above {limit_m_b:g}")
    return schedule


if __name__ == "__main__":
    unit = Costs.unit()
    s = block_search(4, 8, unit, 3)
    print("block v-half p=4 m=8 makespan", timed(s, unit), "(closed form 26.5)", max(peak_memory(s)))
    s = block_search(8, 16, unit, (8 + 4) // 3)
    print("block v-min p=8 m=16 bubble", round(simulate(s).bubble_rate, 4), "(.1933)")
    s = greedy(8, 16, unit, None, "v-min")
    print("greedy v-min p=8 m=16 bubble", round(simulate(s).bubble_rate, 4), "(.2195)", max(peak_memory(s)))
    s = greedy(4, 8, unit, None, "v-half")
    print("greedy v-half p=4 m=8", timed(s, unit), max(peak_memory(s)))
