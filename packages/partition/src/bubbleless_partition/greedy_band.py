"""RoundPipe's partitioner, as a baseline: pack layers greedily under a cap from a narrow band, keep the best.

RoundPipe tries every stage-time cap between the slowest layer's time and 1.1 times it, packs layers
greedily (a stage takes layers until the next would pass the cap) and keeps the best result. It prices
layers by compute alone, with no transfer time. There the number of stages is free (stages are jobs for
a worker pool); here it is fixed, so two honest adaptations:

- the band starts at ``max(slowest layer, total / num_stages)``, the least cap that could fit
  ``num_stages`` stages (below it every cap packs too many), and widens by 1.1x steps while no cap in it
  packs into ``num_stages`` stages;
- a packing with fewer stages than asked is completed by halving its heaviest splittable stages.

"Best" is judged as every other method is, by ``price_pipeline`` (transfers included).
"""

from __future__ import annotations

from .contiguous import smallest_contiguous_cap
from .layers import Profile
from .memory import check_cap
from .partition import Partition, price_pipeline
from .ranges import RangeCosts

BAND = 1.1
"""RoundPipe's band: caps from the floor up to 1.1 times it."""


def greedy_pack(times: list[float], cap: float) -> list[int]:
    """Layer counts of a greedy packing: close a stage when the next layer would take it past ``cap``."""
    sizes, current, count = [], 0.0, 0
    for t in times:
        if count and current + t > cap:
            sizes.append(count)
            current, count = 0.0, 0
        current += t
        count += 1
    sizes.append(count)
    return sizes


def _split_heaviest(sizes: list[int], times: list[float], num_stages: int) -> list[int]:
    """Add stages by cutting the heaviest multi-layer stage at its most even point until there are enough."""
    sizes = list(sizes)
    while len(sizes) < num_stages:
        starts = [sum(sizes[:s]) for s in range(len(sizes))]
        loads = [(sum(times[a:a + n]), s) for s, (a, n) in enumerate(zip(starts, sizes, strict=True)) if n > 1]
        _, s = max(loads)
        a, n = starts[s], sizes[s]
        half = min(range(1, n), key=lambda m: abs(sum(times[a:a + m]) - sum(times[a + m:a + n])))
        sizes[s:s + 1] = [half, n - half]
    return sizes


def _caps_in(times: list[float], low: float, high: float) -> list[float]:
    """Every cap in [low, high] at which the greedy packing can change: the sums of consecutive layers."""
    caps = {low, high}
    for i in range(len(times)):
        total = 0.0
        for t in times[i:]:
            total += t
            if total > high:
                break
            if total >= low:
                caps.add(total)
    return sorted(caps)


def cut_greedy_band(profile: Profile, *, num_stages: int, memory_cap: float | None, **_) -> Partition:
    times = [layer.train_time for layer in profile.layers]
    low = max(max(times), sum(times) / num_stages)
    best: Partition | None = None
    while best is None:
        for cap in _caps_in(times, low, low * BAND):
            sizes = greedy_pack(times, cap)
            if len(sizes) > num_stages:
                continue
            candidate = price_pipeline(profile, _split_heaviest(sizes, times, num_stages), method="greedy-band")
            if best is None or candidate.bottleneck < best.bottleneck:
                best = candidate
        low *= BAND
    check_cap(best, memory_cap, "greedy-band", lambda: smallest_contiguous_cap(RangeCosts.of(profile), num_stages))
    return best
