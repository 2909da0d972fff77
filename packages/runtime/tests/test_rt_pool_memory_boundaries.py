"""What the pool's memory plan counts at a job's edges, as the executor reserves it: the tensors a layer
hands on beside its main one (uploaded and reserved in full, where ``measure`` counts the main tensor
alone), the output gradient a layer-0 backward job's B uploads (it hands none down), and at layer 0 the
copy of the caller's micro-batch a GPU worker makes. Each was left out before: plans the fit check
passed then ran out of their budget at step."""

from dataclasses import replace

import pytest
import torch
from torch import nn

from bubbleless_offload import DeviceOutOfMemory
from bubbleless_runtime import pool_plan
from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline, _copied_input_bytes
from bubbleless_runtime.pool_memory import device_peaks
from bubbleless_runtime.pool_plan_cap import forward_input_bytes, held_microbatch_bytes
from bubbleless_schedules import Schedule
from bubbleless_schedules.roundrobin_layout import pool_groups

WIDTH, SIDE, ROWS = 16, 128, 16


class _Lift(nn.Module):
    """A first layer that also starts a wide side tensor, which every layer after it hands on untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.proj(x), x.new_zeros(x.shape[0], SIDE)


class _Carry(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, activation):
        hidden, side = activation
        return hidden + torch.tanh(self.linear(hidden)), side


def _model(layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(_Lift(), *[_Carry() for _ in range(layers - 1)])


def _loss(output, target):
    return nn.functional.mse_loss(output[0], target, reduction="sum")


def _batch():
    torch.manual_seed(1)
    return torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH)


def _pool_profile(layers: int, microbatches: int):
    """The pool's own profile of ``_model`` (``profile_layers``, as ``partition="auto"`` takes it), with unit
    timings so the plan under a budget does not follow the machine's noise."""
    profile = pool_plan.profile_layers(list(_model(layers)), _batch()[0][: ROWS // microbatches], torch.device("cpu"))
    timed = tuple(replace(c, forward=1.0, input_grad=1.0, weight_grad=1.0, recompute=1.0) for c in profile.layers)
    return profile.with_(layers=timed)


def test_rt_pool_memory_the_plan_counts_the_side_tensors_a_layer_hands_on():
    """Budgets of 4-7 kB were accepted and then ran out at the first upload ("no room for the input of 1F0"):
    the profile counted 64 bytes a token of each layer's output, the main tensor, and the pool uploads 576
    (the side tensor too). Every budget is now refused up front or run within."""
    microbatches = 4
    profile = _pool_profile(6, microbatches)
    assert {c.output_bytes_per_token for c in profile.layers} == {(WIDTH + SIDE) * 4}
    inputs, targets = _batch()
    ran = 0
    for budget in (4000, 5000, 6000, 7000, 8000, 12000):
        try:
            pipe = RoundRobinPipeline(_model(6), devices=["cpu"] * 2, num_microbatches=microbatches, loss_fn=_loss,
                                      partition=profile, memory_budget=budget, timeout=60)
        except ValueError as error:  # refused up front is allowed; running out is not
            assert "no round-robin plan" in str(error) or "does not fit" in str(error)
            continue
        estimated = [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, profile)]
        try:
            pipe.step(inputs, targets)
        except DeviceOutOfMemory as error:
            raise AssertionError(f"budget {budget}: the plan passed the fit check ({estimated}) but ran out") from error
        assert all(w.budget.peak <= e for w, e in zip(pipe.workers, estimated, strict=True)), budget
        ran += 1
    assert ran >= 2


LAYER0_ALONE = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=4 microbatches=2 layout=roundrobin meta.forward_layers=2 "
    "meta.last_layers=2 meta.backward_layers=1,1\n"
    "0LOAD 0F0 0F1 1LOAD 1F0 1B0 1F1 1B1 1STORE 2LOAD 2R0 2B0 2R1 2B1 2STORE\n3LOAD 3R0 3B0 3R1 3B1 3STORE\n")
"""Device 1 runs only job 3, the backward job of layer 0, whose saved bytes are small (a Linear's input)."""


def test_rt_pool_memory_a_layer_zero_backward_job_counts_the_gradient_its_b_uploads():
    """Job 3 (layer 0) hands no gradient down, so the old rule (twice its input boundary) counted it none, but
    its B uploads the gradient of its output: 4,608 bytes here. The estimate was 1,856 bytes on device 1, the
    executor reserved 5,696."""
    profile = _pool_profile(4, 2)
    pipe = RoundRobinPipeline(_model(4), devices=["cpu"] * 2, num_microbatches=2, loss_fn=_loss,
                              schedule=LAYER0_ALONE, timeout=60)
    estimated = [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, profile)]
    pipe.step(*_batch())
    reserved = [w.budget.peak for w in pipe.workers]
    assert all(r <= e for r, e in zip(reserved, estimated, strict=True)), (reserved, estimated)
    tokens = profile.tokens_per_microbatch
    assert held_microbatch_bytes(pipe.groups, 3, profile) == \
        (profile.layers[0].activation_bytes_per_token + profile.layers[0].output_bytes_per_token) * tokens


def test_rt_pool_memory_layer_zero_counts_the_copy_of_the_callers_micro_batch_a_gpu_makes():
    """A GPU worker copies the caller's micro-batch for each layer-0 job and reserves it (a CPU worker reads it
    where it is): the plan counts ``input_bytes`` of it for a forward job's F and a gradient job's R to B."""
    profile = _pool_profile(4, 2)
    groups = pool_groups(LAYER0_ALONE)
    assert forward_input_bytes(groups, 0, profile, 100) == 100
    assert forward_input_bytes(groups, 0, profile) == 0
    assert held_microbatch_bytes(groups, 3, profile, 100) == held_microbatch_bytes(groups, 3, profile) + 100
    assert held_microbatch_bytes(groups, 2, profile, 100) == held_microbatch_bytes(groups, 2, profile)  # layer 1
    sample = torch.zeros(4, WIDTH)
    assert _copied_input_bytes(sample, [torch.device("cpu")] * 2) == 0
    assert _copied_input_bytes((sample, torch.zeros(4, dtype=torch.long)), [torch.device("cuda", 0)]) == 4 * WIDTH * 4 + 32
    assert _copied_input_bytes(None, [torch.device("cuda", 0)]) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: the layer-0 copy is a GPU's")
def test_rt_pool_memory_on_a_gpu_the_executor_reserves_no_more_than_the_plan_counts():
    inputs, targets = tiny_batch(16, width=64)
    pipe = RoundRobinPipeline(tiny_model(6, width=64), devices=["cuda:0", "cuda:0"], num_microbatches=4,
                              loss_fn=tiny_loss, partition="auto", sample_input=inputs[:4], timeout=60)
    assert pipe.input_bytes == 4 * 64 * 4
    estimated = [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, pipe.profile, pipe.input_bytes)]
    pipe.step(inputs, targets)
    reserved = [w.budget.peak for w in pipe.workers]
    assert all(r <= e for r, e in zip(reserved, estimated, strict=True)), (reserved, estimated)
