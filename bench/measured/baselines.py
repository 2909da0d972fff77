"""The baselines, measured: torch's Schedule1F1B (built by bench/runtime/vs_torch.py), DeepSpeed ZeRO-3
with parameters and optimizer offloaded to the CPU (ZeRO-Infinity without NVMe), the same with both
swapped to files on disk through DeepSpeed's async_io op (ZeRO-Infinity with NVMe offload, needs
libaio) and ZeRO-2 with the optimizer offloaded, all with DeepSpeed's CPU Adam, PyTorch FSDP2
(``fully_shard``) with ``CPUOffloadPolicy``, and plain DistributedDataParallel.

Data-parallel systems average gradients over ranks (and DeepSpeed divides by its accumulation steps),
so their loss is scaled by ``world`` (and the steps) to train the same problem as the pipelines; the
loss they report is unscaled and summed over ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

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


DEEPSPEED_SYSTEMS = {"zero-infinity": (3, "cpu"), "zero-infinity-nvme": (3, "nvme"), "zero2": (2, "cpu")}
"""system -> (ZeRO stage, where the offloaded state lives): parameters (stage 3) and optimizer state."""

AIO = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
       "overlap_events": True, "use_gds": False}
"""DeepSpeed's documented ``aio`` defaults (deepspeed/runtime/swap_tensor/constants.py), written out so
the record shows them. A partition under ``max(1 MiB, block_size)`` is not swappable
(``AsyncPartitionedParameterSwapper.swappable_tensor``) and stays in memory: on the tiny model only the
embedding's and the LM head's partitions (1 MiB each per rank) are swapped; the optimizer state (fp32
master weights, both Adam moments) of every parameter is."""


def largest_parameter(scenario: Scenario) -> int:
    """Elements of the tiny model's largest parameter (embedding / LM head, or an MLP projection)."""
    shape = scenario.model
    return max(shape.vocab * shape.hidden, 2 * shape.intermediate * shape.hidden, 3 * shape.hidden**2)


def cpu_offload(scenario: Scenario, *, stage: int, nvme_path: str | None) -> dict:
    """``zero_optimization``'s entries offloading the optimizer state (and at stage 3 the parameters) to
    host memory ("pinned": a no-op on DeepSpeed's CPU accelerator)."""
    zero = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def nvme_offload(scenario: Scenario, *, stage: int, nvme_path: str | None) -> dict:
    """``zero_optimization``'s entries swapping the parameters and the optimizer state to files under
    ``nvme_path`` (ZeRO-Infinity; stage 3 only).

    The parameter swap buffers hold the largest parameter (DeepSpeed's default, 5 x 1e8 elements, would
    allocate 2 GB a rank for a 3 M parameter model); ``max_in_cpu: 0`` keeps no fp32 parameter in
    memory. ``stage3_prefetch_bucket_size: 0`` works around a DeepSpeed 0.19 bug: the NVMe prefetch
    (``PartitionedParameterCoordinator.__prefetch_nvme_param_partitions``) queues a parameter once per
    use in the trace, the LM head is used at the end of forward and again at the start of backward, and
    the second swap-in of the same id fails ``assert param_id not in self.param_id_to_buffer_id``
    (partitioned_param_swapper.py, "param 51 already assigned swap buffer id 3") on the second step;
    the all-gather prefetch de-duplicates ("Avoid duplicates"), the NVMe one does not. A zero bucket
    skips both prefetches (``if self.__prefetch_bucket_sz > 0`` guards the NVMe call).
    """
    if stage != 3 or not nvme_path:
        raise ValueError(f"NVMe offload is ZeRO stage 3 with an nvme_path (got stage {stage}, nvme_path "
                         f"{nvme_path!r}): a directory on a disk that takes O_DIRECT, not tmpfs")
    where = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}
    return {"offload_optimizer": {**where, "buffer_count": 4},
            "offload_param": {**where, "buffer_count": 5, "buffer_size": largest_parameter(scenario), "max_in_cpu": 0},
            "stage3_prefetch_bucket_size": 0}


OFFLOAD = {"cpu": (cpu_offload, {}), "nvme": (nvme_offload, {"aio": AIO})}
"""offload device -> (its ``zero_optimization`` entries, the top-level config sections it adds)."""


def deepspeed_config(scenario: Scenario, *, stage: int, world: int, device: str = "cpu",
                     nvme_path: str | None = None) -> dict:
    """The DeepSpeed config of ZeRO ``stage`` with its state offloaded to ``device`` ("cpu", or "nvme":
    swap files under ``nvme_path``)."""
    if device not in OFFLOAD:
        raise ValueError(f"offload device must be one of {', '.join(OFFLOAD)}, got {device!r}")
    zero_entries, sections = OFFLOAD[device]
    return {
        "train_batch_size": scenario.global_batch,
        "train_micro_batch_size_per_gpu": scenario.micro_batch,
        "gradient_accumulation_steps": scenario.microbatches // world,
        "optimizer": {"type": "AdamW", "params": {"lr": scenario.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                   "weight_decay": 0.0}},
        "zero_optimization": {"stage": stage, **zero_entries(scenario, stage=stage, nvme_path=nvme_path)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        **{name: dict(section) for name, section in sections.items()},
    }


def swap_directory(device: str):
    """Where NVMe offload swaps (a fresh directory, removed with everything in it on exit; TMPDIR picks
    the disk), or nothing for CPU offload."""
    if device == "nvme":
        return tempfile.TemporaryDirectory(prefix="zero-infinity-nvme-")
    return contextlib.nullcontext()


def deepspeed_zero(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    stage, device = DEEPSPEED_SYSTEMS[system]
    if device == "nvme":
        missing = aio_unavailable()
        if missing:
            raise RuntimeError(f"{system} skipped: {missing}")
    with swap_directory(device) as nvme_path:
        out = _deepspeed_steps(rank, scenario, stage=stage, device=device, nvme_path=nvme_path, steps=steps,
                               warmup=warmup, seq_len=seq_len)
    return out


def _deepspeed_steps(rank: int, scenario: Scenario, *, stage: int, device: str, nvme_path: str | None, steps: int,
                     warmup: int, seq_len: int) -> dict:
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    world = dist.get_world_size()
    model = nn.Sequential(*make_layers(scenario))
    config = deepspeed_config(scenario, stage=stage, world=world, device=device, nvme_path=nvme_path)
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
    if nvme_path is not None:  # what went to disk, and where (gone once the directory is removed)
        out["nvme_path"] = nvme_path
        out["swapped_files"] = {os.path.relpath(d, nvme_path): len(f) for d, _, f in os.walk(nvme_path) if f}
        engine.destroy()  # DeepSpeed's hooks and swappers go before their files do
    return out


def nvme_available() -> bool:
    """ZeRO-Infinity's NVMe offload needs libaio (DeepSpeed's async_io op)."""
    import ctypes.util

    return ctypes.util.find_library("aio") is not None


def aio_unavailable() -> str:
    """Why DeepSpeed's async_io op cannot be built here ("" when it can): DeepSpeed's own check, which
    compiles and links a call to io_submit against -laio (libaio.so.1 alone, without the headers and the
    libaio.so link of libaio-dev, does not do)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as error:
        return f"deepspeed is not installed ({error})"
    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        return ("DeepSpeed's async_io op needs libaio's headers and library: apt-get install libaio-dev "
                "(it compiles against them on first use)")
    return ""


def torch_version() -> str:
    return torch.__version__
