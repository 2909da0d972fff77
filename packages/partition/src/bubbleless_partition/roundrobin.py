"""Asymmetric groupings for round-robin workers (RoundPipe-style): one for forward jobs, one for backward.

A round-robin job runs one group over all micro-batches on whichever worker is next, so what must
balance is the time of each job, forward or backward. A backward job recomputes its forward and then
runs I and W, about three times a forward job per layer, so forward groups come out about three times
as long. The last group is one fused job (forward, loss, backward, no recompute) and ends both groupings.

Each job's time per micro-batch is the longer of its compute and its weight upload (weight bytes over the
host link) spread over the micro-batches, since the next job's weights prefetch while one computes
(``partition.roundrobin_job_time``). Activation traffic rides other streams and is not counted.

``num_stages`` is the number of backward groups, the fused one included. The backward grouping is the
min-max DP over those job times; the forward grouping is then the fewest forward groups whose slowest
job is no slower than the slowest backward job (each optimal for its count, by the same DP).
"""

from __future__ import annotations

from .contiguous import smallest_contiguous_cap
from .layers import Profile
from .memory import cap_error
from .minmax import min_max_cut, sizes_of
from .partition import Partition, price_roundrobin
from .ranges import RangeCosts

_TOLERANCE = 1e-9


def _allowed(ranges: RangeCosts, memory_cap: float | None):
    if memory_cap is None:
        return lambda i, j: True
    return lambda i, j: ranges.stage_memory(i, j) <= memory_cap


def cut_roundrobin(profile: Profile, *, num_stages: int, memory_cap: float | None,
                   num_microbatches: int, **_) -> Partition:
    ranges = RangeCosts.of(profile)
    n = ranges.n
    allowed = _allowed(ranges, memory_cap)

    def upload(i, j):
        return ranges.upload(i, j) / num_microbatches

    def backward_job(i, j):
        work = ranges.span(ranges.train if j == n else ranges.backward, i, j)
        return max(work, upload(i, j))

    def forward_job(i, j):
        return max(ranges.span(ranges.forward, i, j), upload(i, j))

    found = min_max_cut(n, num_stages, backward_job, allowed)
    if found is None:
        raise cap_error(memory_cap, "group", smallest_contiguous_cap(ranges, num_stages), num_stages)
    slowest_backward, backward_bounds = found
    fused_start = backward_bounds[-2]
    forward_bounds = (0,)
    if fused_start > 0:
        choice = None
        for count in range(1, fused_start + 1):
            grouping = min_max_cut(fused_start, count, forward_job, allowed)
            if grouping is None:
                continue
            if choice is None or grouping[0] < choice[0]:
                choice = grouping
            if grouping[0] <= slowest_backward * (1 + _TOLERANCE):
                break
        if choice is None:  # only when the cap already failed above; kept as a guard
            raise cap_error(memory_cap, "group", smallest_contiguous_cap(ranges, num_stages), num_stages)
        forward_bounds = choice[1]
    forward_sizes = sizes_of(forward_bounds) if fused_start > 0 else ()
    fused = n - fused_start
    return price_roundrobin(
        profile, forward_sizes + (fused,), sizes_of(backward_bounds), num_microbatches=num_microbatches,
    )
