"""The one search every contiguous method shares: split n layers into k ranges minimising the largest cost.

Dynamic programming over (stages used, layers covered): ``best[s][j]`` is the smallest possible
slowest-stage cost when the first ``s`` stages cover layers ``[0, j)``. Costs are any function of a
range, so the transfer at each cut (which depends on where the cut falls) and a per-stage memory cap
(a range either fits or is not allowed) come in exactly. O(k n^2) calls of ``cost``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

RangeFn = Callable[[int, int], float]
RangeOk = Callable[[int, int], bool]


def _always(start: int, stop: int) -> bool:
    return True


def min_max_cut(n: int, k: int, cost: RangeFn, allowed: RangeOk = _always) -> tuple[float, tuple[int, ...]] | None:
    """Optimal boundaries ``(0, b1, ..., n)`` for ``k`` non-empty ranges, or None if no allowed cut exists.

    The slowest stage is exact. Among cuts that tie on it, the DP leans to even ones (smaller sum of squared
    stage costs, carried along greedily, so a heuristic), then to the earliest boundaries: when one heavy
    layer sets the slowest stage, the others still come out balanced, and the result is deterministic.
    """
    if not 1 <= k <= n:
        return None
    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    came_from = [[-1] * (n + 1) for _ in range(k + 1)]
    best[0][0] = (0.0, 0.0)
    for s in range(1, k + 1):
        # Stage s ends at j; the stages after it need at least one layer each.
        for j in range(s, n - (k - s) + 1):
            for i in range(s - 1, j):
                before = best[s - 1][i]
                if before[0] == float("inf") or not allowed(i, j):
                    continue
                c = cost(i, j)
                candidate = (max(before[0], c), before[1] + c * c)
                if candidate < best[s][j]:
                    best[s][j] = candidate
                    came_from[s][j] = i
    if best[k][n][0] == float("inf"):
        return None
    bounds = [n]
    for s in range(k, 0, -1):
        bounds.append(came_from[s][bounds[-1]])
    return best[k][n][0], tuple(reversed(bounds))


def sizes_of(boundaries: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(b - a for a, b in pairwise(boundaries))


def boundaries_of(sizes: tuple[int, ...]) -> tuple[int, ...]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + size)
    return tuple(out)
