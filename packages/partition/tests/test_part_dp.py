"""The min-max DP is optimal: checked against every cut of small random profiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from part_strategies import all_sizes, brute_force, profiles

from bubbleless_partition import LayerCost, Profile, cut, price_pipeline


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=150, deadline=None)
@given(profile=profiles(), data=st.data())
def test_part_dp_matches_brute_force(profile, data):
    k = data.draw(st.integers(1, profile.num_layers))
    best = brute_force(profile, k)
    found = cut(profile, num_stages=k, method="dp")
    assert sum(found.sizes) == profile.num_layers and len(found.sizes) == k
    assert _close(found.bottleneck, best.bottleneck), (found.sizes, best.sizes)


@settings(max_examples=150, deadline=None)
@given(profile=profiles(), data=st.data())
def test_part_dp_memory_cap_matches_brute_force(profile, data):
    k = data.draw(st.integers(1, profile.num_layers))
    memories = [max(price_pipeline(profile, s, method="x").stage_memory) for s in all_sizes(profile.num_layers, k)]
    cap = data.draw(st.sampled_from(sorted(set(memories)))) * data.draw(st.sampled_from([0.999, 1.0, 1.5]))
    assume(cap > 0)
    best = brute_force(profile, k, memory_cap=cap)
    if best is None:
        with pytest.raises(ValueError, match=f"smallest cap that fits is {min(memories):.0f} bytes"):
            cut(profile, num_stages=k, method="dp", memory_cap=cap)
        return
    found = cut(profile, num_stages=k, method="dp", memory_cap=cap)
    assert max(found.stage_memory) <= cap
    assert _close(found.bottleneck, best.bottleneck)


@settings(max_examples=100, deadline=None)
@given(profile=profiles(max_layers=9), data=st.data())
def test_part_dp_never_worse_than_greedy_band_or_others(profile, data):
    k = data.draw(st.integers(1, profile.num_layers))
    dp = cut(profile, num_stages=k, method="dp")
    for method in ("greedy-band", "uniform", "params"):
        other = cut(profile, num_stages=k, method=method)
        assert len(other.sizes) == k
        assert dp.bottleneck <= other.bottleneck * (1 + 1e-9) + 1e-9, method


def test_part_dp_beats_greedy_band_when_transfers_matter():
    """Greedy-band packs by compute alone; a cut after the wide layer costs a large transfer it does not see."""
    wide = dict(forward=1.0, input_grad=1.0, weight_grad=1.0)
    layers = [LayerCost(name=str(i), output_bytes_per_token=(8e6 if i == 1 else 1e3), **wide) for i in range(4)]
    profile = Profile(layers=tuple(layers), link_bandwidth=1.0)  # 8e6 bytes at 1 GB/s: 8 ms
    dp, band = cut(profile, num_stages=2, method="dp"), cut(profile, num_stages=2, method="greedy-band")
    assert band.sizes == (2, 2) and dp.sizes != (2, 2)
    assert dp.bottleneck < band.bottleneck


def test_part_uniform_and_params_rules():
    layers = [LayerCost(name=str(i), forward=1, input_grad=1, weight_grad=1, param_bytes=(30 if i == 0 else 10))
              for i in range(6)]
    profile = Profile(layers=tuple(layers))
    assert cut(profile, num_stages=4, method="uniform").sizes == (2, 2, 1, 1)
    assert cut(profile, num_stages=2, method="params").sizes == (2, 4)  # 40 | 40 bytes


def test_part_partition_fields():
    layers = [LayerCost(name=str(i), forward=1, input_grad=2, weight_grad=1, param_bytes=4) for i in range(5)]
    part = cut(Profile(layers=tuple(layers), state_bytes_per_param_byte=2.0), num_stages=2, method="dp")
    assert part.sizes == (2, 3) and part.boundaries == (0, 2, 5)  # ties go to the earliest cut
    assert part.stage_costs == (8.0, 12.0) and part.stage_memory == (16.0, 24.0)
    assert part.bottleneck == 12.0 and part.ideal == 10.0 and part.ratio == 1.2
    assert list(part.layers_of(1)) == [2, 3, 4] and part.rank_costs == part.stage_costs
