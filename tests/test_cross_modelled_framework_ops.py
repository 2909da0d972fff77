"""The data-parallel frameworks' measured host work (bench/modelled/framework_ops.py) and how the
baselines' cost models price it (bench/modelled/baselines.py ``host_work_s``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modelled.baselines import framework_units, host_work_s  # noqa: E402
from bench.modelled.common import Point, profile_of  # noqa: E402
from bench.modelled.cpu_ops import load_cpu_profile, ops_path, small_ops_to_dict, with_small_ops  # noqa: E402
from bench.modelled.framework_ops import (  # noqa: E402
    BLOCKS,
    FRAMEWORKS,
    UNIT,
    WIDTHS,
    FrameworkCost,
    FrameworkOps,
    costs_from_timings,
    framework_ops_from_dict,
    framework_ops_to_dict,
    param_bytes_of,
    units_of,
)
from bench.modelled.registry import predict  # noqa: E402
from bubbleless_partition import HARDWARE, TransformerShape, save_hardware  # noqa: E402

TINY = TransformerShape(name="tiny", num_layers=6, hidden=256, intermediate=768, heads=4, kv_heads=4, vocab=2048)
BASELINES = ("zero-infinity", "zero2", "fsdp-offload")


def _ops():
    from tests.test_cross_modelled_small_ops import OPS

    return OPS


def _cost(scale: float = 1.0) -> FrameworkCost:
    return FrameworkCost(microbatch_unit_s=1e-4 * scale, microbatch_byte_s=1e-9 * scale, step_unit_s=2e-4 * scale,
                         step_byte_s=5e-10 * scale)


def _cpu(framework: FrameworkOps | None):
    return with_small_ops(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), _ops(), framework=framework)


def _point(hw) -> Point:
    return Point(shape=TINY, hardware=hw, gpus=2, seq_len=256, global_batch=8, precision="fp32")


def _framework(scale: float = 1.0) -> FrameworkOps:
    return FrameworkOps(costs={f: _cost(scale) for f in FRAMEWORKS})


def _stack(width: int):
    from bench.modelled.framework_ops import _stack as benchmark_stack

    return benchmark_stack(width)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_cross_framework_ops_fit_recovers_a_planted_fixed_and_per_byte_cost(framework):
    """Timings planted as cost = units x unit_s + bytes x byte_s over the stack's real units (its root
    included): the fit gives back each figure (a fit that counted 32 modules or 8 units would be 3% or
    12% off)."""
    units = units_of(_stack(WIDTHS[0]))[UNIT[framework]]
    size = {w: param_bytes_of(_stack(w)) for w in WIDTHS}
    unit_s, per_byte, step_unit_s, step_byte = 3e-4, 2e-9, 1e-4, 7e-10
    timings = {("plain", w): (0.001 * w, 0.001 * w) for w in WIDTHS}
    for w in WIDTHS:
        mb = 0.001 * w + units * unit_s + size[w] * per_byte
        timings[(framework, w)] = (mb, mb + units * step_unit_s + size[w] * step_byte)
    cost = costs_from_timings(timings, framework=framework)
    assert cost.microbatch_unit_s == pytest.approx(unit_s, rel=1e-3)
    assert cost.microbatch_byte_s == pytest.approx(per_byte, rel=1e-3)
    assert cost.step_unit_s == pytest.approx(step_unit_s, rel=1e-3)
    assert cost.step_byte_s == pytest.approx(step_byte, rel=1e-3)


def test_cross_framework_ops_benchmark_stack_counts_its_root_as_the_prediction_does():
    """The fit's units are the benchmark stack's own: per block 4 modules, 6 tensors, 1 fully_shard unit,
    and the root (a module DeepSpeed hooks, a unit FSDP2 shards, no tensor), which
    ``baselines.framework_units`` counts in the tiny model too."""
    assert units_of(_stack(WIDTHS[0])) == {"module": BLOCKS * 4 + 1, "parameter tensor": BLOCKS * 6,
                                           "fully_shard unit": BLOCKS + 1}
    assert units_of(_stack(WIDTHS[0])) == units_of(_stack(WIDTHS[1]))  # the fit assumes one count at both widths


def test_cross_framework_ops_prediction_counts_the_calibration_model_as_built():
    """``framework_units`` (the prediction's count) equals ``units_of`` (the fit's) on the model the
    calibration measures, built: nn.Sequential(*make_layers(scenario)), as bench/measured/baselines.py wraps it."""
    from torch import nn

    from bench.measured.calibration import tiny_shape
    from bench.measured.scenario import load_scenario
    from bench.measured.tiny import make_layers

    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    point = replace(_point(_cpu(None)), shape=tiny_shape(scenario))
    assert framework_units(point) == units_of(nn.Sequential(*make_layers(scenario)))


def test_cross_framework_ops_refuse_negative_costs_and_missing_frameworks():
    with pytest.raises(ValueError, match=">= 0"):
        replace(_cost(), microbatch_byte_s=-1.0)
    with pytest.raises(ValueError, match="re-run"):
        FrameworkOps(costs={"zero3-offload": _cost()})
    with pytest.raises(ValueError, match="re-run"):
        framework_ops_from_dict({"value": {"zero3-offload": {"microbatch_unit_s": 1.0}}, "source": ""})


def test_cross_framework_ops_round_trip_beside_the_cpu_profile(tmp_path):
    path = tmp_path / "cpu.yaml"
    save_hardware(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), path)
    data = small_ops_to_dict(_ops())
    ops_path(path).write_text(yaml.safe_dump(data))
    assert load_cpu_profile(path).framework is None  # not measured: priced at zero
    data["framework"] = framework_ops_to_dict(_framework())
    ops_path(path).write_text(yaml.safe_dump(data))
    loaded = load_cpu_profile(path)
    assert loaded.framework == _framework()
    hash(loaded)  # profiles key caches


def test_cross_framework_ops_units_of_the_tiny_model():
    units = framework_units(_point(_cpu(None)))
    assert units == {"module": 48, "parameter tensor": 52, "fully_shard unit": 9}
    assert set(UNIT.values()) == set(units)


@pytest.mark.parametrize("system", BASELINES)
def test_cross_framework_ops_add_their_measured_host_work_to_the_step(system):
    bare, priced, doubled = (predict(system, _point(_cpu(f))) for f in (None, _framework(), _framework(2.0)))
    point = _point(_cpu(_framework()))
    prof = profile_of(point, loss_chunk_tokens=None)
    per_mb, boundary = host_work_s(system, point, prof)
    steps = 8 // 2  # micro-batches per rank
    assert priced.details["host_work_s"] == pytest.approx(steps * per_mb)
    assert priced.details["optimizer_s"] == pytest.approx(boundary)  # the boundary replaces the modelled optimizer
    assert bare.details["host_work_s"] == 0.0
    assert priced.step_s > bare.step_s - bare.details["optimizer_s"]
    assert doubled.step_s - priced.step_s == pytest.approx(steps * per_mb + boundary)


@pytest.mark.parametrize("name", sorted(HARDWARE))
@pytest.mark.parametrize("system", BASELINES)
def test_cross_framework_ops_leave_every_gpu_profile_at_zero(name, system):
    point = Point(shape=TINY, hardware=HARDWARE[name], gpus=2, seq_len=256, global_batch=8)
    assert host_work_s(system, point, profile_of(point, loss_chunk_tokens=None)) is None
    assert predict(system, point).details["host_work_s"] == 0.0
