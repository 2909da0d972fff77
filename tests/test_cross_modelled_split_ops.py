"""The measured cost of the runtime's backward split on the CPU profile (bench/modelled/split_ops.py) and
how the stage-bound model prices it (bench/modelled/ours.py ``_split_priced``)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modelled.calibrate import cpu_point  # noqa: E402
from bench.modelled.cpu_ops import SmallOps, load_cpu_profile, with_small_ops  # noqa: E402
from bench.modelled.registry import predict  # noqa: E402
from bench.modelled.split_ops import (  # noqa: E402
    SplitBackward,
    measure_split_backward,
    split_backward_from_dict,
    split_backward_to_dict,
)
from bubbleless_partition import HARDWARE, TransformerShape, save_hardware  # noqa: E402

TINY = TransformerShape(name="tiny", num_layers=6, hidden=256, intermediate=768, heads=4, kv_heads=4, vocab=2048)
OPS = SmallOps(gemm_tflops=(0.1, 0.2, 0.4), attention_tflops=(0.05, 0.025), elementwise_gb_s=(10.0, 20.0),
               loss_gb_s=(8.0, 4.0), op_overhead_s=1e-5)


def _hw(split: SplitBackward | None):
    return with_small_ops(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), OPS, split_backward=split)


def _step(system: str, split: SplitBackward | None) -> float:
    point = cpu_point(TINY, hardware=_hw(split), gpus=2, seq_len=256, global_batch=8, precision="fp32")
    return predict(system, point).details["compute_s"]


def test_cross_split_ops_scale_the_split_stages_and_leave_an_unsplit_schedule_alone():
    free, costly = None, SplitBackward(forward_ratio=1.1, backward_ratio=1.2)
    assert _step("bubbleless-1f1b", costly) == _step("bubbleless-1f1b", free)  # B actions only
    # ZB-V splits every stage: every F, I and W scaled, so the makespan is between 1.1x and 1.2x
    assert 1.1 * _step("zbv", free) - 1e-9 <= _step("zbv", costly) <= 1.2 * _step("zbv", free) + 1e-9
    neutral = SplitBackward(forward_ratio=1.0, backward_ratio=1.0)
    assert _step("zbv", neutral) == pytest.approx(_step("zbv", free))


def test_cross_split_ops_refuse_bad_ratios_and_round_trip_through_the_ops_file(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        SplitBackward(forward_ratio=0.0, backward_ratio=1.0)
    with pytest.raises(ValueError, match="split_backward entry"):
        split_backward_from_dict({"value": [1.0]})
    split = SplitBackward(forward_ratio=1.05, backward_ratio=1.06, source="test")
    assert split_backward_from_dict(split_backward_to_dict(split)) == split
    import yaml

    from bench.modelled.cpu_ops import ops_path, small_ops_to_dict

    hw_path = tmp_path / "cpu.yaml"
    save_hardware(_hw(None), hw_path)
    ops_path(hw_path).write_text(yaml.safe_dump(small_ops_to_dict(OPS)))
    assert load_cpu_profile(hw_path).split_backward is None
    ops_path(hw_path).write_text(yaml.safe_dump({**small_ops_to_dict(OPS), "split_backward": split_backward_to_dict(split)}))
    assert load_cpu_profile(hw_path).split_backward == split


def test_cross_split_ops_measure_positive_ratios_at_a_small_size():
    split = measure_split_backward(tokens=16, hidden=32, intermediate=64, heads=2, layers=2, repeats=1)
    assert split.forward_ratio > 0 and split.backward_ratio > 0 and "defer_weight_grads" in split.source


def test_cross_split_ops_refuse_no_repeats_and_infinite_ratios():
    with pytest.raises(ValueError, match="repeats must be a positive int"):
        measure_split_backward(repeats=0)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="finite positive"):
            SplitBackward(forward_ratio=bad, backward_ratio=1.0)


def test_cross_split_ops_price_only_what_the_schedule_splits():
    """DualPipeV runs some micro-batches whole (B) and splits others (I, W) on one stage: B keeps the plain
    backward, I and W's compute carry the split's ratio (W's accumulation not: measured apart), and F the
    deferred forward's extra in the share of the stage's micro-batches it splits."""
    from bench.modelled.ours import _split_priced
    from bubbleless_schedules import Costs, Kind, generate, simulate

    base = Costs((1.0, 2.0, 3.0, 4.0), (1.0, 1.5, 2.0, 2.5), (1.0, 1.0, 2.0, 2.0), 0.0)
    schedule = generate("dualpipev", num_ranks=2, num_microbatches=8, costs=base)
    kinds = [[a.kind for _, _, a in schedule.all_actions() if a.stage == s] for s in range(4)]
    assert any(Kind.B in k and Kind.I in k for k in kinds), "the case this prices: a stage that mixes B and I"
    accumulation = (0.25, 0.25, 0.5, 0.5)
    priced = _split_priced(base, accumulation, schedule, SplitBackward(forward_ratio=1.5, backward_ratio=2.0))
    for s, k in enumerate(kinds):
        share = k.count(Kind.I) / 8
        assert priced.of(Kind.B, s) == base.backward_input[s] + base.backward_weight[s]
        assert priced.of(Kind.F, s) == pytest.approx(base.forward[s] * (1 + 0.5 * share))
        if share:
            assert priced.of(Kind.I, s) == 2 * base.backward_input[s]
            assert priced.of(Kind.W, s) == pytest.approx(2 * (base.backward_weight[s] - accumulation[s]) + accumulation[s])
    # the simulator runs on those prices
    timeline = simulate(schedule, priced)
    assert timeline.makespan > simulate(schedule, base).makespan
    zb = generate("zbv", num_ranks=2, num_microbatches=8, costs=base)  # splits every micro-batch
    assert _split_priced(base, accumulation, zb, SplitBackward(forward_ratio=1.5, backward_ratio=2.0)).forward == (
        1.5, 3.0, 4.5, 6.0)
    one_f_one_b = generate("1f1b", num_ranks=4, num_microbatches=8, costs=base)
    assert _split_priced(base, accumulation, one_f_one_b, SplitBackward(forward_ratio=1.5, backward_ratio=2.0)) is base
