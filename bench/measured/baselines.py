"""The baselines, measured: torch's Schedule1F1B (built by bench/runtime/vs_torch.py), DeepSpeed ZeRO-3
with parameters and optimizer offloaded to the CPU (ZeRO-Infinity without NVMe) and ZeRO-2 with the
optimizer offloaded, both with DeepSpeed's CPU Adam, PyTorch FSDP2 (``fully_shard``) with
``CPUOffloadPolicy``, and plain DistributedDataParallel.

Data-parallel systems average gradients over ranks (and DeepSpeed divides by its accumulation steps),
so their loss is scaled by ``world`` (and the steps) to train the same problem as the pipelines; the
loss they report is unscaled and summed over ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch
import torch.distributed as dist
from torch import nn

from .common import all_reduce_sum, data_parallel_slices, timed_steps
from .scenario import Scenario
from .tiny import TokenLoss, adamw, batch, make_layers


def torch_1f1b(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    from bench.runtime.vs_torch import torch_schedule

    world = dist.get_world_size()
    layers = make_layers(scenario)
    run = torch_schedule(rank, world, "loop1", "Schedule1F1B", scenario.model.hidden, scenario.microbatches, layers,
                         loss=TokenLoss(scenario.global_batch * seq_len))
    per_stage = len(layers) // world
    optimizer = adamw([p for layer in layers[rank * per_stage:(rank + 1) * per_stage] for p in layer.parameters()],
                      scenario)

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = run(x, y)
        optimizer.step()
        return loss

    return timed_steps(step, steps=steps, warmup=warmup)


def ddp(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    world = dist.get_world_size()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*make_layers(scenario)))
    optimizer = adamw(model.parameters(), scenario)
    loss_fn = TokenLoss(scenario.global_batch * seq_len, scale=world)

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        optimizer.zero_grad(set_to_none=True)
        parts, total = data_parallel_slices(x, y, rank=rank, world=world, microbatches=scenario.microbatches), 0.0
        for j, (xj, yj) in enumerate(parts):
            with model.no_sync() if j < len(parts) - 1 else contextlib.nullcontext():
                loss = loss_fn(model(xj), yj)
                loss.backward()
            total += float(loss.detach()) / world
        optimizer.step()
        return all_reduce_sum(total)

    return timed_steps(step, steps=steps, warmup=warmup)


def fsdp_offload(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = nn.Sequential(*make_layers(scenario))
    policy = CPUOffloadPolicy(pin_memory=False)  # no accelerator: pinning needs one
    for layer in model:
        fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    optimizer = adamw(model.parameters(), scenario)
    loss_fn = TokenLoss(scenario.global_batch * seq_len, scale=world)

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for xj, yj in data_parallel_slices(x, y, rank=rank, world=world, microbatches=scenario.microbatches):
            loss = loss_fn(model(xj), yj)
            loss.backward()  # reduce-scatters each micro-batch; the sharded gradients accumulate
            total += float(loss.detach()) / world
        optimizer.step()
        return all_reduce_sum(total)

    return timed_steps(step, steps=steps, warmup=warmup)


def deepspeed_config(scenario: Scenario, *, stage: int, world: int) -> dict:
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_batch_size": scenario.global_batch,
        "train_micro_batch_size_per_gpu": scenario.micro_batch,
        "gradient_accumulation_steps": scenario.microbatches // world,
        "optimizer": {"type": "AdamW", "params": {"lr": scenario.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                   "weight_decay": 0.0}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def deepspeed_zero(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    world = dist.get_world_size()
    stage = 3 if system == "zero-infinity" else 2
    model = nn.Sequential(*make_layers(scenario))
    config = deepspeed_config(scenario, stage=stage, world=world)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                                   dist_init_required=False)
    accumulation = config["gradient_accumulation_steps"]
    loss_fn = TokenLoss(scenario.global_batch * seq_len, scale=world * accumulation)

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        total = 0.0
        for xj, yj in data_parallel_slices(x, y, rank=rank, world=world, microbatches=scenario.microbatches):
            loss = loss_fn(engine(xj), yj)
            engine.backward(loss)
            engine.step()  # an optimizer step at the accumulation boundary only
            total += float(loss.detach()) / (world * accumulation)
        return all_reduce_sum(total)

    out = timed_steps(step, steps=steps, warmup=warmup)
    out["optimizer"] = type(getattr(optimizer, "optimizer", optimizer)).__name__
    return out


def nvme_available() -> bool:
    """ZeRO-Infinity's NVMe offload needs libaio (DeepSpeed's async_io op)."""
    import ctypes.util

    return ctypes.util.find_library("aio") is not None


def torch_version() -> str:
    return torch.__version__
