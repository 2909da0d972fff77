"""The pool's automatic plan holds whatever precision the step runs in: under the caller's autocast (cast
cache off) each held micro-batch saves its own low-precision copy of its group's weights, which the
run-time budget counts, so the profile the plan and the fit check use counts it too (``pool_precision``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_memory import device_peaks
from bubbleless_runtime.pool_precision import PRECISIONS, saved_and_output_bytes

WIDTH, ROWS, M = 64, 16, 4


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(6)])


def _loss(output, target):
    return nn.functional.mse_loss(output.float(), target, reduction="sum")


def _batch():
    torch.manual_seed(1)
    return torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)


def _step(pipe, inputs, targets, dtype):
    if dtype is None:
        return pipe.step(inputs, targets)
    with torch.autocast("cpu", dtype=dtype):
        return pipe.step(inputs, targets)


def test_rt_pool_precision_a_linear_counts_its_cast_weight_and_the_most_of_every_precision():
    rows = ROWS // M
    (saved, output), = saved_and_output_bytes([nn.Linear(WIDTH, WIDTH)], torch.randn(rows, WIDTH),
                                             torch.device("cpu"))
    fp32_input = rows * WIDTH * 4
    cast_weight_and_input = (WIDTH * WIDTH + rows * WIDTH) * 2  # autocast's copies, a new storage each
    assert saved == max(fp32_input, cast_weight_and_input) == cast_weight_and_input
    assert output == rows * WIDTH * 4  # float32 is the widest output
    assert len(PRECISIONS) == 3 and None in PRECISIONS


@pytest.mark.parametrize("options", [{}, {"split_backward": True}, {"recompute_ahead": 2}])
@pytest.mark.parametrize("dtype", PRECISIONS, ids=lambda d: str(d).replace("torch.", ""))
def test_rt_pool_precision_the_executor_reserves_no_more_than_the_fit_check_counts(dtype, options):
    """On the old float32-only profile a gradient job's micro-batch was counted 2 x 4 x 64 x 4 bytes a layer
    and reserved 64 x 64 x 2 more for the weight's cast copy under autocast: the peak exceeded the estimate."""
    inputs, targets = _batch()
    pipe = RoundRobinPipeline(_model(), devices=["cpu"] * 2, num_microbatches=M, loss_fn=_loss, partition="auto",
                              sample_input=inputs[: ROWS // M], schedule_options=options, timeout=60)
    estimated = [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, pipe.profile)]
    for worker in pipe.workers:
        worker.budget.reset_peak()
    assert torch.isfinite(_step(pipe, inputs, targets, dtype))
    reserved = [worker.budget.peak for worker in pipe.workers]
    assert all(r <= e for r, e in zip(reserved, estimated, strict=True)), (reserved, estimated)


@pytest.mark.parametrize("budget", [100_000, 120_000, 140_000, 200_000])
def test_rt_pool_precision_a_plan_the_constructor_accepts_runs_under_autocast_within_its_budget(budget):
    """The reviewer's case: a budget the constructor's fit check passes ran out under bfloat16 autocast
    ("no room for the activations ... saves", one cast copy of a weight): 100-140 kB did at 9ef859d."""
    inputs, targets = _batch()
    try:
        pipe = RoundRobinPipeline(_model(), devices=["cpu"] * 2, num_microbatches=M, loss_fn=_loss,
                                  partition="auto", sample_input=inputs[: ROWS // M], memory_budget=budget,
                                  timeout=60)
    except ValueError as error:  # refused up front is allowed; running out is not
        assert "does not fit" in str(error) or "no round-robin plan" in str(error)
        assert budget < 200_000, "200 kB holds a plan: the case must run, or this test checks nothing"
        return
    for dtype in PRECISIONS:
        assert torch.isfinite(_step(pipe, inputs, targets, dtype))


def test_rt_pool_precision_pinned_to_fp32_counts_its_bytes_alone_and_no_more_than_the_most():
    """``precisions_of("fp32")`` raises the profile to float32's counts only: per layer no more than the most of
    every precision, and here less (no cast copy of each weight: 512 bytes a token against 2,304)."""
    from bubbleless_runtime.auto_partition import measure
    from bubbleless_runtime.pool_precision import bounded_over_precisions, precisions_of

    layers, sample = list(_model()), _batch()[0][: ROWS // M]
    measured = measure(layers, sample, repeats=1)
    most = bounded_over_precisions(measured, layers, sample, torch.device("cpu"))
    fp32 = bounded_over_precisions(measured, layers, sample, torch.device("cpu"), precisions_of("fp32"))
    for pinned, widest in zip(fp32.layers, most.layers, strict=True):
        assert pinned.activation_bytes_per_token <= widest.activation_bytes_per_token
        assert pinned.output_bytes_per_token <= widest.output_bytes_per_token
    assert sum(c.activation_bytes_per_token for c in fp32.layers) < sum(c.activation_bytes_per_token for c in most.layers)


PINNED_BUDGET = 44_000
"""Bytes per device that the fp32-pinned plan of ``_model`` fits and the plan for any precision does not (on the
build VM the leanest fitting budgets were 40,000 and 52,000, scanned in steps of 4,000)."""


def test_rt_pool_precision_an_fp32_plan_fits_a_budget_the_any_precision_plan_cannot_and_runs_within_it():
    inputs, targets = _batch()
    build = {"devices": ["cpu"] * 2, "num_microbatches": M, "loss_fn": _loss, "partition": "auto",
             "sample_input": inputs[: ROWS // M], "memory_budget": PINNED_BUDGET, "timeout": 60}
    with pytest.raises(ValueError, match="no round-robin plan|does not fit"):
        RoundRobinPipeline(_model(), **build)
    pipe = RoundRobinPipeline(_model(), precision="fp32", **build)
    estimated = [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, pipe.profile)]
    assert max(estimated) <= PINNED_BUDGET
    assert torch.isfinite(pipe.step(inputs, targets))  # the run-time budget would raise DeviceOutOfMemory
    assert all(w.budget.peak <= e for w, e in zip(pipe.workers, estimated, strict=True))
    with pytest.raises(ValueError, match=r"planned for precision='fp32' \(no autocast\) but step\(\) runs under "
                                         r"autocast at torch.bfloat16.*precision=None plans for any"):
        _step(pipe, inputs, targets, torch.bfloat16)  # refused before it runs: the plan has no room for it
    assert all(w.budget.used == 0 for w in pipe.workers)
    assert torch.isfinite(pipe.step(inputs, targets))


def test_rt_pool_precision_a_bf16_plan_refuses_an_fp32_step_and_a_bad_name_lists_the_choices():
    inputs, targets = _batch()
    pipe = RoundRobinPipeline(_model(), devices=["cpu"] * 2, num_microbatches=M, loss_fn=_loss, precision="bf16",
                              partition=None, timeout=60)
    with pytest.raises(ValueError, match=r"precision='bf16' \(autocast at torch.bfloat16\) but step\(\) runs under "
                                         r"no autocast"):
        pipe.step(inputs, targets)
    assert torch.isfinite(_step(pipe, inputs, targets, torch.bfloat16))
    with pytest.raises(ValueError, match=r"precision='float32' is not one of \['bf16', 'fp16', 'fp32'\] or None"):
        RoundRobinPipeline(_model(), devices=["cpu"] * 2, num_microbatches=M, loss_fn=_loss, precision="float32")
