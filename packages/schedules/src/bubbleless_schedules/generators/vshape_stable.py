"""The published greedy V-Min / V-Half (sail-sg ``zbv_greedy``) as one more candidate of the V search.

From the reference page's description: every micro-batch k takes the stable pattern's slots
(``vshape_blocks.stable_block``) plus 6k; empty slots take the pending W's first in, first out; then, in
time order, each forward and input-gradient moves to the earliest free slot after its inputs when that
does not raise its rank's peak; the W's keep their slots, and the resulting order per rank is timed
by the simulator under the true costs (the page's "squeeze"). Unit slots, no comm: the grid only
fixes the order.

The sweep never rescans the slots a pass skips: each rank keeps its free slots sorted, so a pass finds the
first free one after its inputs by bisection, and a forward, which holds one more activation over the
slots it moves across, first walks back from its slot to the last one already at the peak (none of the
slots up to there can take it; the walk is short since the steady state reaches the peak every few
slots). That makes the greedy linear in m up to the walks: p=32 m=256 in about 0.1 s (the rescanning
sweep took 0.3 s, which kept the greedy to shapes of 12,400 actions).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

from ..action import Action, Kind
from .vshape_blocks import stable_block
from .vshape_greedy import action_table


def stable_greedy_orders(p: int, m: int, kind: str) -> list[list[Action]]:
    """Each rank's order (chunk-0 stage r, chunk-1 stage 2p-1-r) after filling and sweeping."""
    n = 2 * p
    rank_of = [s if s < p else n - 1 - s for s in range(n)]
    block = stable_block(p, kind)
    grid: list[dict[int, tuple[Kind, int, int]]] = [{} for _ in range(p)]
    at: dict[tuple[Kind, int, int], int] = {}
    order = []  # each F and I by (slot, rank), as slot * p + rank: the sweep's time order
    for (k_, stage), slot in block.items():
        if k_ is Kind.W:
            continue
        r, cells = rank_of[stage], grid[rank_of[stage]]
        for k in range(m):
            t = slot + 6 * k
            cells[t] = (k_, stage, k)
            at[(k_, stage, k)] = t
            order.append(t * p + r)
    order.sort()
    for r in range(p):
        _fill_w(grid[r])
    levels = [_levels(cells) for cells in grid]
    peaks = [max(level, default=0) for level in levels]
    free = [[t for t in range(len(level)) if t not in cells] for cells, level in zip(grid, levels, strict=True)]
    for key in order:
        t, r = divmod(key, p)
        k_, s, k = grid[r][t]
        slots = free[r]
        lowest = _ready_slot(at, k_, s, k, n)
        j = bisect_left(slots, lowest)
        if j == len(slots) or slots[j] >= t:
            continue  # no free slot between the pass's inputs and its own
        if k_ is Kind.F:
            # moving an F from t to slot holds one more activation over [slot, t): the slot must lie after
            # the last one in [lowest, t) already at the peak
            level, top, x = levels[r], peaks[r], t - 1
            while x >= slots[j] and level[x] < top:
                x -= 1
            if x >= slots[j]:
                j = bisect_left(slots, x + 1, j)
                if j == len(slots) or slots[j] >= t:
                    continue
            slot = slots[j]
            for y in range(slot, t):
                level[y] += 1
        slot = slots.pop(j)
        insort(slots, t)
        cells = grid[r]
        cells[slot] = cells.pop(t)
        at[(k_, s, k)] = slot
    table = action_table(n, m)
    return [[table[k_][s][k] for _, (k_, s, k) in sorted(cells.items())] for cells in grid]


def _levels(cells) -> list[int]:
    """Chunk activations held after each slot 0..last (an empty slot keeps the level before it); the peak is
    their maximum, and a move updates them in place."""
    step = {Kind.F: 1, Kind.W: -1, Kind.I: 0}
    out, held, get = [], 0, cells.get
    for t in range(max(cells) + 1 if cells else 0):
        cell = get(t)
        if cell is not None:
            held += step[cell[0]]
        out.append(held)
    return out


def _fill_w(cells) -> None:
    """Each input-gradient's W into the first empty slot after it, first in first out; the rest last."""
    backs = sorted((t, c[1:]) for t, c in cells.items() if c[0] is Kind.I)
    queue: deque[tuple[int, int]] = deque()
    t, j, count = min(cells), 0, len(backs)
    while j < count or queue:
        while j < count and backs[j][0] < t:
            queue.append(backs[j][1])
            j += 1
        if queue and t not in cells:
            s, k = queue.popleft()
            cells[t] = (Kind.W, s, k)
        t += 1


def _ready_slot(at, k_, s, k, n) -> int:
    """The first slot after the pass's inputs (unit slots)."""
    if k_ is Kind.F:
        return 0 if s == 0 else at[(Kind.F, s - 1, k)] + 1
    first = at[(Kind.F, s, k)] + 1
    return first if s == n - 1 else max(first, at[(Kind.I, s + 1, k)] + 1)
