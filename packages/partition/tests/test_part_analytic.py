"""The analytic profile follows the FLOP counts it documents."""

from __future__ import annotations

import pytest

from bubbleless_partition import (
    A800,
    HARDWARE,
    MI300X,
    RTX_4090,
    TransformerShape,
    analytic_profile,
    hardware,
)

QWEN3_1_7B = TransformerShape(name="Qwen3-1.7B", num_layers=28, hidden=2048, intermediate=6144, heads=16,
                              kv_heads=8, vocab=151_936, head_dim=128)


def test_part_analytic_layer_costs_follow_flops():
    seq = 4096
    prof = analytic_profile(QWEN3_1_7B, RTX_4090, seq_len=seq)
    assert [layer.name for layer in prof.layers[:2]] == ["embed", "layers.0"]
    assert prof.num_layers == 30 and prof.layers[-1].name == "lm_head"
    layer, head = prof.layers[1], prof.layers[-1]
    matmul = 2 * (2048 * (2 * 2048 + 2 * 1024) + 3 * 2048 * 6144) * seq
    attention = 2 * 16 * 128 * seq * seq
    rate = 165.2e12 * 0.6 / 1e3
    assert layer.forward == pytest.approx((matmul + attention) / rate)
    assert layer.weight_grad == pytest.approx(matmul / rate)
    assert layer.input_grad == pytest.approx((matmul + 2 * attention) / rate)
    assert layer.param_bytes == (2048 * (2 * 2048 + 2 * 1024) + 3 * 2048 * 6144 + 2 * 2048) * 2  # bf16
    # the 151,936-entry head is several decoder layers' worth (the reason a good cut matters)
    assert 4.5 < head.weight_grad / layer.weight_grad < 6.5
    assert head.param_bytes == pytest.approx(151_937 * 2048 * 2)
    # the embedding is memory bound: cheap forward, no input gradient
    assert prof.layers[0].input_grad == 0 and prof.layers[0].forward < layer.forward / 50


def test_part_analytic_chunked_loss_shrinks_head_memory_not_time():
    whole = analytic_profile(QWEN3_1_7B, RTX_4090, seq_len=16384)
    chunked = analytic_profile(QWEN3_1_7B, RTX_4090, seq_len=16384, loss_chunk_tokens=4096)
    assert chunked.layers[-1].forward == whole.layers[-1].forward
    assert chunked.layers[-1].activation_bytes_per_token < whole.layers[-1].activation_bytes_per_token / 3


def test_part_analytic_moe_counts_active_experts():
    dense = TransformerShape(name="d", num_layers=2, hidden=256, intermediate=512, heads=4, kv_heads=4, vocab=1000)
    moe = TransformerShape(name="m", num_layers=2, hidden=256, intermediate=512, heads=4, kv_heads=4, vocab=1000,
                           experts=8, top_k=1)
    d, m = (analytic_profile(s, A800, seq_len=128).layers[1] for s in (dense, moe))
    assert m.param_bytes > 7 * d.param_bytes / 2  # eight experts stored
    assert m.weight_grad == pytest.approx(d.weight_grad * 1.005, rel=0.01)  # one expert (plus router) active
    with pytest.raises(ValueError, match="both experts and top_k"):
        TransformerShape(name="x", num_layers=1, hidden=8, intermediate=8, heads=1, kv_heads=1, vocab=8, experts=4)


def test_part_hardware_profiles():
    assert {"rtx4090", "a800", "mi300x"} <= set(HARDWARE)
    assert hardware("mi300x") is MI300X and MI300X.peak_tflops > A800.peak_tflops > RTX_4090.peak_tflops
    assert all(hw.source for hw in HARDWARE.values())
    with pytest.raises(ValueError, match="unknown hardware"):
        hardware("h100")


def test_part_analytic_sliced_head_keeps_totals():
    whole = analytic_profile(QWEN3_1_7B, RTX_4090, seq_len=1024)
    sliced = analytic_profile(QWEN3_1_7B, RTX_4090, seq_len=1024, lm_head_shards=2)
    assert [layer.name for layer in sliced.layers[-2:]] == ["lm_head.0", "lm_head.1"]
    assert sum(layer.train_time for layer in sliced.layers[-2:]) == pytest.approx(whole.layers[-1].train_time)
    assert sum(layer.param_bytes for layer in sliced.layers[-2:]) == pytest.approx(whole.layers[-1].param_bytes)
    assert sliced.layers[-2].output_bytes_per_token == 2048 * 2 + 12  # hidden state and the running softmax
