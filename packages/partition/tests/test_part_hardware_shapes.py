"""Published model shapes: the config numbers give the parameter counts the models are named for."""

from __future__ import annotations

import pytest

from bubbleless_partition import RTX_4090, SHAPES, analytic_profile, shape


@pytest.mark.parametrize("name, total, active", [
    ("qwen3-1.7b", 1.72e9, 1.72e9),      # tied embeddings: 2.03B if counted twice
    ("llama-3.1-8b", 8.03e9, 8.03e9),
    ("qwen3-32b", 32.8e9, 32.8e9),
    ("qwen3-235b-a22b", 235.1e9, 22.2e9),
])
def test_part_shapes_parameter_counts_match_the_names(name, total, active):
    s = shape(name)
    assert s.parameter_count() == pytest.approx(total, rel=0.005)
    assert s.active_parameter_count() == pytest.approx(active, rel=0.005)
    assert "config.json" in s.source


def test_part_shapes_profile_and_unknown_name():
    assert set(SHAPES) == {"qwen3-1.7b", "llama-3.1-8b", "qwen3-32b", "qwen3-235b-a22b"}
    prof = analytic_profile(shape("qwen3-235b-a22b"), RTX_4090, seq_len=64)
    assert prof.num_layers == 96
    with pytest.raises(ValueError, match="unknown model shape"):
        shape("gpt-5")
