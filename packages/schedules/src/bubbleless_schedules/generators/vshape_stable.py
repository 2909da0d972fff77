"""The published greedy V-Min / V-Half (sail-sg ``zbv_greedy``) as one more candidate of the V search.

From the reference page's description: every micro-batch k takes the stable pattern's slots
(``vshape_blocks.stable_block``) plus 6k; empty slots take the pending W's first in, first out; then, in
time order, each forward and input-gradient moves to the earliest free slot after its inputs when that
does not raise its rank's peak; the W's keep their slots, and the resulting order per rank is timed
by the simulator under the true costs (the page's "squeeze"). Unit slots, no comm: the grid only
fixes the order. Shapes up to ``STABLE_UP_TO`` actions: each move rescans the slots it skips.
"""

from __future__ import annotations

from ..action import Action, Kind
from .vshape_blocks import stable_block

STABLE_UP_TO = 12_400
"""Actions up to which the greedy is built (p=32 up to m=64; 0.04 s there since the peak is kept per slot)."""


def stable_greedy_orders(p: int, m: int, kind: str) -> list[list[Action]]:
    """Each rank's order (chunk-0 stage r, chunk-1 stage 2p-1-r) after filling and sweeping."""
    n = 2 * p
    rank_of = [s if s < p else n - 1 - s for s in range(n)]
    block = stable_block(p, kind)
    grid: list[dict[int, tuple[Kind, int, int]]] = [{} for _ in range(p)]
    for (k_, stage), slot in block.items():
        if k_ is Kind.W:
            continue
        for k in range(m):
            grid[rank_of[stage]][slot + 6 * k] = (k_, stage, k)
    for r in range(p):
        _fill_w(grid[r])
    at = {(k_, s, k): t for cells in grid for t, (k_, s, k) in cells.items()}
    levels = [_levels(cells) for cells in grid]
    peaks = [max(level, default=0) for level in levels]
    for t, r, (k_, s, k) in sorted((t, r, c) for r, cells in enumerate(grid) for t, c in cells.items()):
        if k_ is Kind.W:
            continue
        cells, level = grid[r], levels[r]
        for slot in range(_ready_slot(at, k_, s, k, n), t):
            if slot in cells:
                continue
            # moving an F from t to slot holds one more activation over [slot, t); moving an I changes nothing
            if k_ is Kind.F and max(level[slot:t]) + 1 > peaks[r]:
                continue
            cells[slot] = cells.pop(t)
            at[(k_, s, k)] = slot
            if k_ is Kind.F:
                for x in range(slot, t):
                    level[x] += 1
            break
    return [[Action(s, k_, k) for _, (k_, s, k) in sorted(cells.items())] for cells in grid]


def _levels(cells) -> list[int]:
    """Chunk activations held after each slot 0..last (an empty slot keeps the level before it); the peak is
    their maximum, and a move updates them in place (the sweep once recomputed the peak per try: quadratic)."""
    out, held = [], 0
    for t in range(max(cells) + 1 if cells else 0):
        k_ = cells[t][0] if t in cells else None
        held += 1 if k_ is Kind.F else -1 if k_ is Kind.W else 0
        out.append(held)
    return out


def _fill_w(cells) -> None:
    """Each input-gradient's W into the first empty slot after it, first in first out; the rest last."""
    backs = sorted((t, c) for t, c in cells.items() if c[0] is Kind.I)
    queue: list[tuple[int, int]] = []
    j, t, end = 0, min(cells), max(cells)
    while j < len(backs) or queue:
        while j < len(backs) and backs[j][0] < t:
            queue.append(backs[j][1][1:])
            j += 1
        if t not in cells and queue:
            s, k = queue.pop(0)
            cells[t] = (Kind.W, s, k)
        t += 1
        assert t <= end + 6 * len(backs) + 6, "W filling did not end"


def _ready_slot(at, k_, s, k, n) -> int:
    """The first slot after the pass's inputs (unit slots)."""
    if k_ is Kind.F:
        return 0 if s == 0 else at[(Kind.F, s - 1, k)] + 1
    first = at[(Kind.F, s, k)] + 1
    return first if s == n - 1 else max(first, at[(Kind.I, s + 1, k)] + 1)
