"""Profiles survive a YAML round trip exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from part_strategies import profiles

from bubbleless_partition import (
    RTX_4090,
    TransformerShape,
    analytic_profile,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    save_profile,
)


def test_part_yaml_round_trip(tmp_path):
    shape = TransformerShape(name="tiny", num_layers=3, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=100)
    original = analytic_profile(shape, RTX_4090, seq_len=32, loss_chunk_tokens=16)
    original = original.with_(extra={"note": "round trip"}, microbatches_in_flight=2)
    path = save_profile(original, tmp_path / "p.yaml")
    assert "format: bubbleless-partition/profile-v1" in path.read_text()
    loaded = load_profile(path)
    assert loaded == original and loaded.extra == {"note": "round trip"}


@settings(max_examples=30, deadline=None)
@given(profile=profiles())
def test_part_dict_round_trip(profile):
    import yaml

    assert profile_from_dict(yaml.safe_load(yaml.safe_dump(profile_to_dict(profile)))) == profile


def test_part_load_rejects_other_files(tmp_path):
    (tmp_path / "x.yaml").write_text("layers: []\n")
    with pytest.raises(ValueError, match="not a partition profile"):
        load_profile(tmp_path / "x.yaml")
    with pytest.raises(ValueError, match="unknown profile fields"):
        profile_from_dict({"format": "bubbleless-partition/profile-v1", "layerz": []})
