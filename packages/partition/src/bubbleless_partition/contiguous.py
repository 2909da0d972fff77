"""Cuts with one stage per rank: equal layer counts, balanced parameters, and the optimal min-max DP."""

from __future__ import annotations

from .layers import Profile
from .memory import cap_error, check_cap
from .minmax import min_max_cut, sizes_of
from .partition import Partition, price_pipeline
from .ranges import RangeCosts


def uniform_sizes(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Equal layer counts; the first ``num_layers % num_stages`` stages take one more."""
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


def smallest_contiguous_cap(ranges: RangeCosts, num_stages: int) -> float:
    """The smallest per-stage memory any contiguous cut into ``num_stages`` stages can reach."""
    found = min_max_cut(ranges.n, num_stages, ranges.stage_memory)
    assert found is not None  # num_stages <= n was checked by cut()
    return found[0]


def _priced(profile: Profile, sizes, method: str, memory_cap: float | None, num_stages: int) -> Partition:
    partition = price_pipeline(profile, sizes, method=method)
    check_cap(partition, memory_cap, method, lambda: smallest_contiguous_cap(RangeCosts.of(profile), num_stages))
    return partition


def cut_uniform(profile: Profile, *, num_stages: int, memory_cap: float | None, **_) -> Partition:
    """The same number of layers on every stage, whatever they cost (the usual default)."""
    return _priced(profile, uniform_sizes(profile.num_layers, num_stages), "uniform", memory_cap, num_stages)


def cut_params(profile: Profile, *, num_stages: int, memory_cap: float | None, **_) -> Partition:
    """Balance parameter bytes (optimally, by the min-max DP on bytes): good for memory, blind to time."""
    ranges = RangeCosts.of(profile)
    _, bounds = min_max_cut(ranges.n, num_stages, lambda i, j: ranges.span(ranges.params, i, j))
    return _priced(profile, sizes_of(bounds), "params", memory_cap, num_stages)


def cut_dp(profile: Profile, *, num_stages: int, memory_cap: float | None, **_) -> Partition:
    """The optimal contiguous cut: the smallest slowest stage (F+I+W plus its sends) under the memory cap."""
    ranges = RangeCosts.of(profile)
    allowed = (lambda i, j: True) if memory_cap is None else (lambda i, j: ranges.stage_memory(i, j) <= memory_cap)
    found = min_max_cut(ranges.n, num_stages, ranges.stage_time, allowed)
    if found is None:
        raise cap_error(memory_cap, "stage", smallest_contiguous_cap(ranges, num_stages), num_stages)
    return price_pipeline(profile, sizes_of(found[1]), method="dp")
