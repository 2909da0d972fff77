"""Hardware profiles: every field sourced, YAML round trip, the old names and numbers unchanged."""

from __future__ import annotations

import math

import pytest

from bubbleless_partition import (
    A800,
    H200,
    HARDWARE,
    MI300X,
    RTX_4090,
    Hardware,
    hardware,
    hardware_from_dict,
    hardware_to_dict,
    load_hardware,
    save_hardware,
)
from bubbleless_partition.hardware_data import PROFILES


def test_part_hardware_builtins_are_named_and_keep_the_old_figures():
    assert {"rtx4090", "a800", "mi300x", "h200"} <= set(HARDWARE)
    assert hardware("h200") is H200 and hardware("rtx4090") is RTX_4090
    # The analytic profiles and bench/results/partition.md were computed with these.
    assert (RTX_4090.peak_tflops, RTX_4090.efficiency, RTX_4090.link_bandwidth) == (165.2, pytest.approx(0.6), 25.0)
    assert (A800.memory_bandwidth, A800.link_bandwidth, A800.memory_gib) == (2039.0, 200.0, 80.0)
    assert (MI300X.peak_tflops, MI300X.efficiency, MI300X.host_bandwidth) == (1307.4, 0.5, 50.0)
    assert not RTX_4090.peer_to_peer and A800.peer_to_peer
    with pytest.raises(ValueError, match="unknown hardware 'h100'"):
        hardware("h100")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_part_hardware_every_field_has_a_source(name):
    data = PROFILES[name]
    sourced = [k for k, v in data.items() if isinstance(v, dict)]
    assert len(sourced) == 12
    for key in sourced:
        assert data[key]["source"].strip(), f"{name}.{key} has no source"
    hw = HARDWARE[name]
    assert set(hw.sources) == set(sourced)
    assert all(v > 0 for v in hw.sustained_by_dtype.values())
    assert all(hw.sustained_by_dtype[k] <= hw.peak_by_dtype[k] for k in hw.peak_by_dtype)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_part_hardware_yaml_round_trip(name, tmp_path):
    pytest.importorskip("yaml")
    path = save_hardware(HARDWARE[name], tmp_path / f"{name}.yaml")
    text = path.read_text()
    assert text.startswith("format: bubbleless-partition/hardware-v1") and "source:" in text
    back = load_hardware(path)
    assert back == HARDWARE[name] and back.sources == HARDWARE[name].sources
    assert hardware_to_dict(back) == hardware_to_dict(HARDWARE[name])


def test_part_hardware_dict_round_trip_needs_no_yaml():
    for hw in HARDWARE.values():
        assert hardware_from_dict(hardware_to_dict(hw)) == hw


def test_part_hardware_for_dtype_prices_another_rate():
    fp32 = RTX_4090.for_dtype("fp32")
    assert fp32.peak_tflops == 82.6 and math.isclose(fp32.flops_per_ms, 82.6e9 * 0.6)
    with pytest.raises(ValueError, match="no 'fp8' rate"):
        A800.for_dtype("fp8")


def test_part_hardware_hand_built_profile_defaults_the_new_fields():
    hw = Hardware(name="x", peak_tflops=10, efficiency=0.5, memory_bandwidth=100, host_bandwidth=8,
                  link_bandwidth=4, memory_gib=8, source="made up for a test")
    assert hw.pcie_bandwidth == 8 and hw.collective_bandwidth == 4
    assert hw.sustained_by_dtype == {"bf16": 5.0}


@pytest.mark.parametrize("broken, message", [
    ({"memory_gib": {"value": 24.0, "source": " "}}, "needs a non-empty source"),
    ({"memory_gib": 24.0}, "must be {value"),
    ({"bogus": 1}, "unknown hardware fields"),
    ({"format": "other"}, "not a hardware profile"),
])
def test_part_hardware_bad_files_say_what_is_wrong(broken, message):
    data = {**hardware_to_dict(RTX_4090), **broken}
    with pytest.raises(ValueError, match=message):
        hardware_from_dict(data)
