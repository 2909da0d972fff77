"""bench/measured/inrun_ops.py: the cpu profile's small-op rates measured inside a run (``--measure-small-ops``)
and the calibration priced on them, the committed profile's errors said beside."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured.inrun_ops import describe, mean_small_ops, measure  # noqa: E402
from bench.measured.scenario import Scenario, TinyShape  # noqa: E402
from bench.modelled.cpu_ops import SmallOps, small_ops_to_dict  # noqa: E402

SMALL = Scenario(name="test", model=TinyShape(layers=2, hidden=32, heads=2, intermediate=64, vocab=128),
                 seq_len=16, global_batch=4, microbatches=4, steps=2, warmup=1, rounds=1, systems=("ddp",))


def _ops(scale: float) -> dict:
    from bench.modelled.calibrate import cpu_hardware

    o = cpu_hardware().small_ops
    return small_ops_to_dict(SmallOps(
        gemm_tflops=tuple(scale * v for v in o.gemm_tflops), attention_tflops=tuple(scale * v for v in o.attention_tflops),
        elementwise_gb_s=tuple(scale * v for v in o.elementwise_gb_s), loss_gb_s=tuple(scale * v for v in o.loss_gb_s),
        op_overhead_s=o.op_overhead_s / scale, sources=o.sources))


def test_cross_bench_measured_inrun_ops_take_the_mean_of_before_and_after():
    from bench.modelled.calibrate import cpu_hardware

    o = cpu_hardware().small_ops
    mean = mean_small_ops({"before": _ops(1.0), "after": _ops(3.0)})
    assert mean.gemm_tflops == pytest.approx(tuple(2 * v for v in o.gemm_tflops))
    assert mean.op_overhead_s == pytest.approx(o.op_overhead_s * (1 + 1 / 3) / 2)
    assert "gemm_tflops" in describe({"before": _ops(1.0), "after": _ops(3.0)})
    with pytest.raises(ValueError, match="'before' and 'after'"):
        mean_small_ops({"before": _ops(1.0)})


def test_cross_bench_measured_calibration_prices_on_the_runs_rates_and_says_the_committed_errors():
    from bench.measured.calibration import calibration_rows, calibration_section

    measured = {"1f1b": {"tokens_per_s": 1000.0, "tokens_per_s_less_wait": 2000.0}}
    committed = calibration_rows(SMALL, measured)[0][0]
    faster = {"before": _ops(2.0), "after": _ops(2.0)}
    text = "\n".join(calibration_section(SMALL, measured, small_ops=faster))
    assert "Priced on the small-op rates this run measured" in text
    assert f"1f1b {committed.load_free_error:+.1%}" in text  # the committed profile's error, beside
    row = next(line for line in text.splitlines() if line.startswith("| 1f1b |"))
    priced = float(row.split("|")[4].replace(",", ""))
    assert priced > committed.predicted_tokens_per_s  # twice the rates: a faster step
    plain = "\n".join(calibration_section(SMALL, measured))
    assert "Priced on the small-op rates" not in plain


def test_cross_bench_measured_inrun_ops_refuse_a_micro_batch_of_more_than_one_sequence():
    with pytest.raises(ValueError, match="one sequence per micro-batch"):
        measure(SMALL.with_(microbatches=2))
