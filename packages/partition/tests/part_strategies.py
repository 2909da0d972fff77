"""Shared hypothesis strategies and a brute-force oracle for the partition tests."""

from __future__ import annotations

from itertools import combinations, pairwise

from hypothesis import strategies as st

from bubbleless_partition import LayerCost, Profile, price_pipeline

times = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@st.composite
def layer_costs(draw, index: int = 0) -> LayerCost:
    return LayerCost(
        name=f"l{index}", forward=draw(times), input_grad=draw(times), weight_grad=draw(times),
        param_bytes=draw(st.integers(0, 1000)), activation_bytes_per_token=draw(st.integers(0, 100)),
        output_bytes_per_token=draw(st.integers(0, 5_000_000)),
    )


@st.composite
def profiles(draw, min_layers: int = 1, max_layers: int = 7) -> Profile:
    n = draw(st.integers(min_layers, max_layers))
    layers = tuple(draw(layer_costs(i)) for i in range(n))
    return Profile(
        layers=layers, tokens_per_microbatch=draw(st.integers(1, 4)),
        link_bandwidth=draw(st.one_of(st.none(), st.floats(0.5, 50.0))),
        host_bandwidth=draw(st.one_of(st.none(), st.floats(0.001, 1.0))),
    )


def all_sizes(n: int, k: int):
    """Every way to cut n layers into k non-empty contiguous stages."""
    for cuts in combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield tuple(b - a for a, b in pairwise(bounds))


def brute_force(profile: Profile, k: int, memory_cap=None, stage_to_rank=None):
    """The best bottleneck over every cut (None if none meets the cap), priced layer by layer."""
    best = None
    for sizes in all_sizes(profile.num_layers, k):
        priced = price_pipeline(profile, sizes, method="brute", stage_to_rank=stage_to_rank)
        if memory_cap is not None and max(priced.rank_memory) > memory_cap:
            continue
        if best is None or priced.bottleneck < best.bottleneck:
            best = priced
    return best
