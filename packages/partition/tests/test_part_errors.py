"""Bad input says what to change."""

from __future__ import annotations

import pytest

from bubbleless_partition import LayerCost, Profile, cut


def _profile(n=4, param_bytes=100):
    return Profile(layers=tuple(LayerCost(name=str(i), forward=1, input_grad=1, weight_grad=1,
                                          param_bytes=param_bytes * (i + 1)) for i in range(n)))


@pytest.mark.parametrize("method", ["dp", "uniform", "params", "greedy-band", "roundrobin", "auto"])
def test_part_more_stages_than_layers(method):
    with pytest.raises(ValueError, match="num_stages=5 is more than the 4 layers"):
        cut(_profile(), num_stages=5, method=method)


def test_part_v_needs_two_layers_per_rank_and_even_stages():
    with pytest.raises(ValueError, match="more than the 4 layers"):
        cut(_profile(), num_stages=6, method="v")
    with pytest.raises(ValueError, match="must be even"):
        cut(_profile(), num_stages=3, method="v")


@pytest.mark.parametrize("method, smallest", [
    # layers of 100, 200, 300, 400 bytes in two stages: the best is 600 | 400
    ("dp", 600), ("uniform", 600), ("params", 600), ("greedy-band", 600), ("roundrobin", 600),
    # V on one rank holds everything
    ("v", 1000),
])
def test_part_memory_cap_no_cut_meets_gives_smallest(method, smallest):
    stages = 2
    with pytest.raises(ValueError, match=f"smallest cap that fits is {smallest} bytes"):
        cut(_profile(), num_stages=stages, method=method, memory_cap=smallest - 1)
    if method in ("dp", "v", "roundrobin", "params"):  # searches (params: its byte balance is the floor)
        assert max(cut(_profile(), num_stages=stages, method=method, memory_cap=smallest).rank_memory) <= smallest


def test_part_fixed_rule_over_cap_points_to_dp():
    # uniform gives 300 | 700; a cut meeting 600 exists, so the error names it rather than "no cut".
    with pytest.raises(ValueError, match="method='dp'.*600 bytes"):
        cut(_profile(), num_stages=2, method="uniform", memory_cap=650)
    assert cut(_profile(), num_stages=2, method="dp", memory_cap=650).sizes == (3, 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_stages=0), "positive int"),
    (dict(num_stages=2, method="fastest"), "unknown partition method"),
    (dict(num_stages=2, memory_cap=-1), "memory_cap"),
    (dict(num_stages=2, num_microbatches=0), "num_microbatches"),
])
def test_part_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cut(_profile(), **kwargs)


def test_part_bad_records():
    with pytest.raises(ValueError, match="forward must be a finite non-negative"):
        LayerCost(name="x", forward=-1, input_grad=0, weight_grad=0)
    with pytest.raises(ValueError, match="at least one layer"):
        Profile(layers=())
    with pytest.raises(ValueError, match="link_bandwidth"):
        Profile(layers=_profile().layers, link_bandwidth=0)


@pytest.mark.parametrize("field, value", [
    ("forward", float("inf")), ("input_grad", float("nan")), ("weight_grad", -1.0), ("param_bytes", float("inf")),
    ("recompute", float("-inf")), ("forward", "1.0"), ("forward", True),
])
def test_part_layer_cost_refuses_non_finite_or_negative(field, value):
    fields = {"name": "layers.0", "forward": 1.0, "input_grad": 1.0, "weight_grad": 1.0, field: value}
    with pytest.raises(ValueError, match=rf"LayerCost\('layers.0'\)\.{field} must be a finite non-negative number"):
        LayerCost(**fields)


def test_part_layer_cost_is_keyword_only_as_the_readme_shows():
    with pytest.raises(TypeError, match="positional"):
        LayerCost("embed", 1.0, 1.0, 1.0)  # type: ignore[misc]
    assert LayerCost(name="embed", forward=1.0, input_grad=1.0, weight_grad=0.5).recompute == 1.0


@pytest.mark.parametrize("field, value", [("head_dim", 0), ("head_dim", -1), ("expert_intermediate", -5),
                                          ("head_dim", 2.5)])
def test_part_shape_refuses_non_positive_optional_widths(field, value):
    from bubbleless_partition.analytic import TransformerShape

    with pytest.raises(ValueError, match=f"TransformerShape.{field} must be a positive int or None"):
        TransformerShape(name="x", num_layers=2, hidden=64, intermediate=128, heads=4, kv_heads=4, vocab=100,
                         **{field: value})


@pytest.mark.parametrize("kwargs, message", [({"dtype_bytes": 0}, "dtype_bytes is the bytes"),
                                             ({"loss_chunk_tokens": 0}, "loss_chunk_tokens is the tokens"),
                                             ({"loss_chunk_tokens": -1}, "loss_chunk_tokens is the tokens")])
def test_part_analytic_profile_names_the_bad_argument(kwargs, message):
    from bubbleless_partition.analytic import TransformerShape, analytic_profile
    from bubbleless_partition.hardware import hardware

    shape = TransformerShape(name="x", num_layers=2, hidden=64, intermediate=128, heads=4, kv_heads=4, vocab=100)
    with pytest.raises(ValueError, match=message):
        analytic_profile(shape, hardware("rtx4090"), seq_len=16, **kwargs)
