"""V-shape cuts: 2p chunks, rank r holds chunks r and 2p-1-r, balanced on each rank's total.

Rank 0 holds the first chunk (with the embedding) and the last (with the LM head), so balancing chunks
one by one overloads it; what a V schedule waits on is each rank's two chunks together.

The search walks the V from both ends inwards. After ranks ``0..r-1`` the layers left form one middle
range ``[L, R)``; rank r takes ``[L, L')`` from the left and ``[R', R)`` from the right. The last rank
takes the whole middle, since its two chunks are adjacent (the cut between them stays on one device and
moves nothing), so only where its middle cut falls is free: it is set to balance its two chunks. Each
state ``(L, R)`` keeps the smallest slowest-rank-so-far, which makes the result exact (ties lean to
even ranks by the sum of squared rank costs, as in ``minmax``, then to even chunks by the sum of squared
chunk costs). Chunks whose compute alone already exceeds a known feasible answer are never expanded,
which keeps 60-layer models to about a second.

Why even chunks: a V schedule runs a rank's two chunks in a fixed interleaving, so a rank holding one
layer and eleven waits on its long chunk while its short one idles, though its total is the same. Among
the many cuts with the same rank totals (identical decoder layers make them plentiful) the chunk term
picks the even ones; before it, float noise in the sums picked one at random (Qwen3-32B on 8 H200s, 16
chunks: sizes 8, 1, 1, 1, 2, 1, 1, 4 | 5, 7, 7, 6, 7, 7, 7, 1; ZB-V's simulated step 4% longer than on
5, 4, ..., 4; Qwen3-235B-A22B 13%). The comparisons round to ``_RESOLUTION`` for that reason.
"""

from __future__ import annotations

from .layers import Profile
from .memory import cap_error, check_cap
from .minmax import min_max_cut, sizes_of
from .partition import Partition, price_pipeline
from .placement import v_placement
from .ranges import RangeCosts

_TOLERANCE = 1e-9
_RESOLUTION = 1e-10
"""What the search tells apart, relative to the bound (costs) and its square (squared costs): sums of equal
layer costs taken in another order differ in their last bits, far below it."""


def _v_search(n: int, p: int, pair_cost, last_cost, extent, bound: float):
    """Exact min over V cuts of the max rank cost, among cuts whose ranks all cost at most ``bound``.

    ``pair_cost(L, L2, R2, R)`` prices a rank holding ``[L, L2)`` and ``[R2, R)`` as (its cost, inf when not
    allowed; the sum of its two chunks' squared costs), ``last_cost(L, R)`` the last rank holding ``[L, R)``
    likewise, ``extent(i, j)`` is a lower bound of a chunk's share that grows with the chunk (used to stop
    expanding). Returns (value, ((L, R) per rank)) or None.
    """
    limit = bound * (1 + _TOLERANCE) + _TOLERANCE
    unit = max(limit, _TOLERANCE) * _RESOLUTION  # costs in these units, squares in unit * limit, compare as ints
    square_unit = unit * max(limit, _TOLERANCE)

    def value_of(worst: tuple, cost: float, chunks: float) -> tuple[int, int, int, float]:
        """The path's (slowest rank, sum of squared rank costs, sum of squared chunk costs) with one more rank,
        rounded; then the slowest rank's exact cost (what is returned)."""
        return (max(worst[0], round(cost / unit)), worst[1] + round(cost * cost / square_unit),
                worst[2] + round(chunks / square_unit), max(worst[3], cost))

    states = {(0, n): ((0, 0, 0, 0.0), None)}
    history = [states]
    for r in range(p - 1):
        left_over = p - 1 - r  # ranks after this one; each needs two layers
        following: dict[tuple[int, int], tuple[tuple, tuple[int, int]]] = {}
        for (left, right), (worst, _) in states.items():
            for left2 in range(left + 1, right):
                if extent(left, left2) > limit:
                    break
                for right2 in range(right - 1, left2 - 1, -1):
                    if right2 - left2 < 2 * left_over:
                        break
                    if extent(left, left2) + extent(right2, right) > limit:
                        break
                    cost, chunks = pair_cost(left, left2, right2, right)
                    if cost > limit:
                        continue
                    value = value_of(worst, cost, chunks)
                    key = (left2, right2)
                    if key not in following or value < following[key][0]:
                        following[key] = (value, (left, right))
        states = following
        history.append(states)
    best = None
    for (left, right), (worst, _) in states.items():
        if right - left < 2:
            continue
        last, chunks = last_cost(left, right)
        if last > limit:
            continue
        value = value_of(worst, last, chunks)
        if best is None or value < best[0]:
            best = (value, (left, right))
    if best is None:
        return None
    path = [best[1]]
    for r in range(p - 1, 0, -1):
        path.append(history[r][path[-1]][1])
    return best[0][3], tuple(reversed(path))


def _chunks_from(path, middle: int) -> tuple[int, ...]:
    """Boundaries ``(0, ..., n)`` of the 2p chunks from the ``(L, R)`` states and the last rank's middle cut."""
    lefts = [left for left, _ in path]
    rights = [right for _, right in path]
    return tuple(lefts) + (middle,) + tuple(reversed(rights))


def _balanced_middle(ranges: RangeCosts, left: int, right: int) -> int:
    """Where the last rank's two adjacent chunks split: the most even split of its compute."""
    return min(range(left + 1, right),
               key=lambda m: (max(ranges.stage_time(left, m), ranges.stage_time(m, right)), m))


def _pair_search(ranges: RangeCosts, p: int, cost_of, extent, memory_cap: float | None, bound: float):
    def fits(left, left2, right2, right):
        return memory_cap is None or (
            ranges.stage_memory(left, left2) + ranges.stage_memory(right2, right) <= memory_cap)

    def pair_cost(left, left2, right2, right):
        if not fits(left, left2, right2, right):
            return float("inf"), 0.0
        first, second = cost_of(left, left2), cost_of(right2, right)
        return first + second, first * first + second * second

    def last_cost(left, right):
        if memory_cap is not None and ranges.stage_memory(left, right) > memory_cap:
            return float("inf"), 0.0
        middle = _balanced_middle(ranges, left, right)
        first, second = cost_of(left, middle), cost_of(middle, right)
        return cost_of(left, right), first * first + second * second

    return _v_search(ranges.n, p, pair_cost, last_cost, extent, bound)


def _contiguous_bound(ranges: RangeCosts, p: int, cost_of, memory_cap: float | None) -> float:
    """A feasible answer to prune with: the min-max contiguous 2p-chunk cut, priced as a V."""
    allowed = (lambda i, j: True) if memory_cap is None else (lambda i, j: ranges.stage_memory(i, j) <= memory_cap / 2)
    found = min_max_cut(ranges.n, 2 * p, cost_of, allowed)
    if found is None:
        return float("inf")
    b = found[1]
    totals = [cost_of(b[r], b[r + 1]) + cost_of(b[2 * p - 1 - r], b[2 * p - r]) for r in range(p - 1)]
    totals.append(cost_of(b[p - 1], b[p + 1]))
    return max(totals)


def smallest_v_cap(ranges: RangeCosts, p: int) -> float:
    """The smallest per-rank memory any V cut can reach."""
    memory = ranges.stage_memory
    bound = _contiguous_bound(ranges, p, memory, None)
    found = _pair_search(ranges, p, memory, memory, None, bound)
    assert found is not None
    return found[0]


def cut_v(profile: Profile, *, num_stages: int, memory_cap: float | None, **_) -> Partition:
    """``num_stages`` (even) chunks on ``num_stages // 2`` ranks in a V, minimising the slowest rank."""
    if num_stages % 2:
        raise ValueError(f"method='v' puts two chunks on each rank, so num_stages must be even, got {num_stages}")
    p = num_stages // 2
    ranges = RangeCosts.of(profile)

    def compute(i, j):
        return ranges.span(ranges.train, i, j)

    def chunk_cost(i, j):
        return ranges.stage_time(i, j)

    bound = _contiguous_bound(ranges, p, chunk_cost, memory_cap)
    if bound == float("inf"):
        bound = ranges.stage_time(0, ranges.n) * 2 + sum(ranges.transfer)
    found = _pair_search(ranges, p, chunk_cost, compute, memory_cap, bound)
    if found is None:
        raise cap_error(memory_cap, "rank", smallest_v_cap(ranges, p), num_stages)
    left, right = found[1][-1]
    chunks = _chunks_from(found[1], _balanced_middle(ranges, left, right))
    partition = price_pipeline(profile, sizes_of(chunks), method="v", stage_to_rank=v_placement(p))
    check_cap(partition, memory_cap, "v", lambda: smallest_v_cap(ranges, p))
    return partition
