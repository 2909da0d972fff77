"""The measured cost of the decoder backward's copies into the fused projections' layout on the CPU profile
(bench/modelled/layout_ops.py) and how ``common.small_op_profile`` prices it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modelled.calibrate import cpu_point  # noqa: E402
from bench.modelled.common import profile_of  # noqa: E402
from bench.modelled.cpu_ops import SmallOps, load_cpu_profile, ops_path, small_ops_to_dict, with_small_ops  # noqa: E402
from bench.modelled.layout_ops import (  # noqa: E402
    LayoutBackward,
    layout_backward_from_dict,
    layout_backward_to_dict,
    layout_bytes_per_token,
    measure_layout_backward,
)
from bubbleless_partition import HARDWARE, TransformerShape, save_hardware  # noqa: E402

TINY = TransformerShape(name="tiny", num_layers=6, hidden=256, intermediate=768, heads=4, kv_heads=4, vocab=2048)
OPS = SmallOps(gemm_tflops=(0.1, 0.2, 0.4), attention_tflops=(0.05, 0.025), elementwise_gb_s=(10.0, 20.0),
               loss_gb_s=(8.0, 4.0), op_overhead_s=1e-5)


def _layers(layout: LayoutBackward | None):
    hw = with_small_ops(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), OPS, layout_backward=layout)
    point = cpu_point(TINY, hardware=hw, gpus=2, seq_len=256, global_batch=8, precision="fp32")
    return profile_of(point, loss_chunk_tokens=None).layers


def test_cross_layout_ops_add_the_copies_to_each_decoder_layers_input_gradient_only():
    free, priced = _layers(None), _layers(LayoutBackward(gb_s=4.0))
    copies_ms = 256 * layout_bytes_per_token(256, 768, 4) / 4e9 * 1e3  # 4.7 MB at 4 GB/s
    assert copies_ms == pytest.approx(256 * 4 * 2 * (3 * 256 + 2 * 768) / 4e6)
    for a, b in zip(free[1:-1], priced[1:-1], strict=True):
        assert b.input_grad == pytest.approx(a.input_grad + copies_ms)
        assert (b.forward, b.weight_grad) == (a.forward, a.weight_grad)
    assert (free[0], free[-1]) == (priced[0], priced[-1])  # the embedding and the head have no fused split


def test_cross_layout_ops_refuse_a_bad_rate_and_round_trip_through_the_ops_file(tmp_path):
    import yaml

    with pytest.raises(ValueError, match="positive"):
        LayoutBackward(gb_s=0.0)
    with pytest.raises(ValueError, match="layout_backward entry"):
        layout_backward_from_dict({"value": 1.0})
    layout = LayoutBackward(gb_s=12.5, source="test")
    assert layout_backward_from_dict(layout_backward_to_dict(layout)) == layout
    hw_path = tmp_path / "cpu.yaml"
    save_hardware(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), hw_path)
    ops_path(hw_path).write_text(yaml.safe_dump(small_ops_to_dict(OPS)))
    assert load_cpu_profile(hw_path).layout_backward is None
    ops_path(hw_path).write_text(yaml.safe_dump({**small_ops_to_dict(OPS),
                                                 "layout_backward": layout_backward_to_dict(layout)}))
    assert load_cpu_profile(hw_path).layout_backward == layout


def test_cross_layout_ops_measure_a_positive_rate_at_a_small_size():
    layout = measure_layout_backward(tokens=16, hidden=32, intermediate=64, heads=2, repeats=1, cold_bytes=1 << 16)
    assert layout.gb_s > 0 and "unbind" in layout.source
