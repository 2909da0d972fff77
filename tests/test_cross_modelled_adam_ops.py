"""The measured cost of torch.optim.AdamW's step over the model's own tensors on the CPU profile
(bench/modelled/adam_ops.py) and how the pipelines' models price it (``common.rank_optimizer_s``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.modelled.adam_ops import AdamWRates, adamw_from_dict, adamw_to_dict, measure_adamw  # noqa: E402
from bench.modelled.calibrate import cpu_point  # noqa: E402
from bench.modelled.cpu_ops import SmallOps, load_cpu_profile, ops_path, small_ops_to_dict, with_small_ops  # noqa: E402
from bench.modelled.registry import predict  # noqa: E402
from bubbleless_partition import HARDWARE, TransformerShape, save_hardware  # noqa: E402

TINY = TransformerShape(name="tiny", num_layers=6, hidden=256, intermediate=768, heads=4, kv_heads=4, vocab=2048)
OPS = SmallOps(gemm_tflops=(0.1, 0.2, 0.4), attention_tflops=(0.05, 0.025), elementwise_gb_s=(10.0, 20.0),
               loss_gb_s=(8.0, 4.0), op_overhead_s=1e-5)


def _prediction(system: str, adamw: AdamWRates | None, **fields):
    hw = with_small_ops(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), OPS, adamw=adamw)
    return predict(system, cpu_point(TINY, hardware=hw, gpus=2, seq_len=256, global_batch=8, precision="fp32",
                                     **fields))


@pytest.mark.parametrize("system", ["1f1b", "bubbleless-1f1b", "zbv"])
def test_cross_adam_ops_price_the_slowest_ranks_step_over_its_layers(system):
    rates = AdamWRates(params_per_s=(1e8, 2e8, 4e8))
    priced = _prediction(system, rates)
    # every layer at its kind's rate: the embedding (524,288 parameters) and head (524,288 + the norm's 512
    # in the analytic count) and a decoder layer's parameters, summed per rank; the slowest rank is the step's
    unmeasured = _prediction(system, None)
    assert unmeasured.details["optimizer_s"] != priced.details["optimizer_s"]
    emb, dec = 2048 * 256 / 1e8, (4 * 256 * 256 + 3 * 256 * 768 + 2 * 256) / 2e8  # a decoder layer's two norms too
    head = (2048 * 256 + 256) / 4e8  # the head and the final norm
    # two ranks: 1F1B's first holds the embedding and 3 decoder layers (the other 3 and the head: less); zbv's
    # V puts chunks 0 and 3 on rank 0, the embedding, 3 decoder layers and the head
    slowest = {"1f1b": emb + 3 * dec, "bubbleless-1f1b": emb + 3 * dec, "zbv": emb + 3 * dec + head}
    assert priced.details["optimizer_s"] == pytest.approx(slowest[system], rel=1e-9)
    slower = _prediction(system, AdamWRates(params_per_s=(0.5e8, 1e8, 2e8)))
    assert slower.details["optimizer_s"] == pytest.approx(2 * priced.details["optimizer_s"])
    assert priced.step_s - priced.details["optimizer_s"] == pytest.approx(
        unmeasured.step_s - unmeasured.details["optimizer_s"])  # only the optimizer moves
    assert _prediction(system, rates, lora_rank=8).details["optimizer_s"] == 0.0


def test_cross_adam_ops_refuse_bad_rates_and_round_trip_through_the_ops_file(tmp_path):
    import yaml

    for bad in ((1e8, 2e8), (1e8, 0.0, 1e8), (1e8, -1.0, 1e8)):
        with pytest.raises(ValueError, match="embedding, decoder, head"):
            AdamWRates(params_per_s=bad)
    with pytest.raises(ValueError, match="adamw entry"):
        adamw_from_dict({"value": [1.0, 2.0, 3.0]})
    rates = AdamWRates(params_per_s=(1e8, 2e8, 3e8), source="test")
    assert adamw_from_dict(adamw_to_dict(rates)) == rates
    hw_path = tmp_path / "cpu.yaml"
    save_hardware(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), hw_path)
    ops_path(hw_path).write_text(yaml.safe_dump(small_ops_to_dict(OPS)))
    assert load_cpu_profile(hw_path).adamw is None
    ops_path(hw_path).write_text(yaml.safe_dump({**small_ops_to_dict(OPS), "adamw": adamw_to_dict(rates)}))
    assert load_cpu_profile(hw_path).adamw == rates


def test_cross_adam_ops_leave_a_gpu_profile_priced_as_before():
    from bench.modelled.common import Point, profile_of, rank_optimizer_s

    point = Point(shape=TINY, hardware=HARDWARE["rtx4090"], gpus=2, seq_len=256, global_batch=8)
    assert rank_optimizer_s(point, profile_of(point, loss_chunk_tokens=None), [[0, 1], [2, 3]]) is None


def test_cross_adam_ops_measure_positive_rates_at_a_small_size():
    rates = measure_adamw(hidden=32, intermediate=64, heads=2, vocab=64, repeats=1, cold_bytes=1 << 16)
    assert all(v > 0 for v in rates.params_per_s) and "torch.optim.AdamW" in rates.source
