"""Round-robin groupings: forward groups about 3x the backward ones, weight uploads counted."""

from __future__ import annotations

import pytest

from bubbleless_partition import LayerCost, Profile, cut


def _uniform(n, param_bytes=0, host_bandwidth=None):
    layers = tuple(LayerCost(name=str(i), forward=1, input_grad=1, weight_grad=1, param_bytes=param_bytes)
                   for i in range(n))
    return Profile(layers=layers, host_bandwidth=host_bandwidth)


def test_part_roundrobin_forward_groups_three_times_backward():
    # 28 layers, 7 backward groups of 4 (a backward job: R+I+W = 3 per layer, 12 per job); the fused
    # group (F+I+W, no recompute) is the last 4 layers; the 24 before it make 2 forward jobs of 12 layers.
    part = cut(_uniform(28), num_stages=7, method="roundrobin")
    assert part.backward.sizes == (4,) * 7
    assert part.sizes == (12, 12, 4)
    assert part.sizes[-1] == part.backward.sizes[-1]  # the fused group ends both
    forward_groups, backward_groups = part.sizes[:-1], part.backward.sizes[:-1]
    ratio = (sum(forward_groups) / len(forward_groups)) / (sum(backward_groups) / len(backward_groups))
    assert ratio == pytest.approx(3.0)
    assert part.bottleneck == 12.0 and part.ratio == pytest.approx(1.0)


def test_part_roundrobin_upload_bound_groups_shrink_forward_groups():
    # 1 GB per layer at 1 GB/s over 4 micro-batches: 250 ms of upload per layer and micro-batch, far more
    # than the compute, so every job is upload bound and forward groups can hold no more layers than
    # backward groups.
    part = cut(_uniform(28, param_bytes=1e9, host_bandwidth=1.0), num_stages=7, method="roundrobin",
               num_microbatches=4)
    assert part.backward.sizes == (4,) * 7
    assert part.sizes == (4,) * 7
    assert part.bottleneck == pytest.approx(4 * 1e9 / 1e6 / 4)
    # more micro-batches amortise the upload until compute rules again
    amortised = cut(_uniform(28, param_bytes=1e9, host_bandwidth=1.0), num_stages=7, method="roundrobin",
                    num_microbatches=10_000)
    assert amortised.sizes == (12, 12, 4)


def test_part_roundrobin_single_group_is_fused():
    part = cut(_uniform(5), num_stages=1, method="roundrobin")
    assert part.sizes == (5,) and part.backward.sizes == (5,) and part.bottleneck == 15.0
