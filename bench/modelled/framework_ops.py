"""The data-parallel frameworks' own host work per micro-batch and per optimizer step, measured on this
CPU on a synthetic stack (not on the calibration's runs): what the baselines' cost models
(``baselines.py``) add on a ``CpuHardware`` profile.

    python -m bench.modelled.framework_ops      # measures, writes the ``framework`` entry of cpu_ops.yaml

Why: on the tiny calibration scenario ZeRO-Infinity, FSDP2 with CPU offload and ZeRO-2 spend 1.84, 1.95
and 1.37 CPU seconds a step on the FLOPs DDP does in 0.97 (bench/results/measured_calibration.md). A
profile of one step of each (``cProfile`` by thread CPU time and ``torch.profiler``) puts the extra in
the frameworks' per-tensor Python (DeepSpeed's pre/post forward and backward module hooks, the parameter
coordinator's fetch and release, FSDP2's pre/post forward hooks and its autograd registration), their
copies (flatten into gather and reduce buckets: ``aten::copy_`` and ``aten::cat``; fp32 gradient
partitions on the host), and the gloo collectives themselves (ZeRO-3's gradient ``reduce_scatter`` at
about 25 ms of the calling thread per micro-batch for 14 MB of gradients; FSDP2's all-gather forward
and again backward, and its reduce-scatter). On a CPU "device" all of it runs on the same cores as
the compute, so none of it overlaps.

How: each framework, set up as bench/measured/baselines.py sets it up (DeepSpeed ZeRO-3 with
``offload_param`` and ``offload_optimizer`` to the CPU, ZeRO-2 with ``offload_optimizer``, FSDP2
``fully_shard`` per block and on the root with ``CPUOffloadPolicy``; DeepSpeed's CPU-Adam, torch AdamW for
FSDP), trains a stack of ``BLOCKS`` pre-norm blocks (``LayerNorm``, two ``Linear`` with bias: 4 modules,
6 tensors, one ``fully_shard`` unit; with the root, 33 modules, 48 tensors, 9 units: ``units_of``) on
2 gloo ranks with one torch thread each, at two widths; the same stack in plain torch is the reference.
Per rank: its process CPU time (every thread: gloo's too, ``getrusage``), median over steps, of a
non-boundary micro-batch's forward and backward, and of the boundary's extra (reduction epilogue,
optimizer, parameter refresh). A few tokens per micro-batch keep the FLOPs negligible. Two widths give
a fixed cost per unit of the framework's work (``*_unit_s``, ``UNIT``: Python per module or tensor,
collective launches; counted on the built stack, root included, as the prediction counts the tiny model)
and a cost per parameter byte (``*_byte_s``: copies, collective bytes, the optimizer at the boundary)
beyond plain torch's (forward and backward, no optimizer). CPU time, not wall, so the load on a shared machine costs no time (as the other small-op rates, ``cpu_ops``).
"""

from __future__ import annotations

import resource
import statistics
from dataclasses import dataclass, field

FRAMEWORKS = ("zero3-offload", "zero2-offload", "fsdp2-offload")
"""The frameworks measured: bench/measured/baselines.py's zero-infinity, zero2 and fsdp-offload."""
BLOCKS = 8
WIDTHS = (32, 512)
"""A narrow block (the fixed cost dominates) and a wide one (its 2 x 512^2 fp32 weights, 2 MiB, dominate)."""
TOKENS = 4
MICROBATCHES = 2
"""Micro-batches per optimizer step: one non-boundary, one boundary."""
STEPS, WARMUP = 6, 2


UNIT = {"zero3-offload": "module", "zero2-offload": "parameter tensor", "fsdp2-offload": "fully_shard unit"}
"""What each framework does its fixed work per: DeepSpeed ZeRO-3 hooks every module (pre/post forward and
backward, fetch and release), ZeRO-2 every parameter tensor (its gradient hook, the bucket copy), FSDP2
every ``fully_shard`` unit (one all-gather, one reduce-scatter, its hooks)."""


def sharded_units(model) -> list:
    """The modules FSDP2 ``fully_shard``s in an ``nn.Sequential``, in order: each child, then the root (it
    holds whatever no child does). ``_fsdp`` shards the benchmark stack so, as bench/measured/baselines.py's
    ``fsdp_offload`` shards the tiny model."""
    return [*model, model]


def units_of(model) -> dict[str, int]:
    """Units of each framework's fixed work (``UNIT``) in a built ``nn.Sequential``: every module, the root
    included (DeepSpeed ZeRO-3 registers its hooks from the root down), every parameter tensor, every
    ``sharded_units`` unit. The fit divides by this count of the stack it measured, and
    ``baselines.framework_units`` counts the tiny model the same way (tests check both)."""
    return {"module": sum(1 for _ in model.modules()), "parameter tensor": sum(1 for _ in model.parameters()),
            "fully_shard unit": len(sharded_units(model))}


def param_bytes_of(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True, kw_only=True)
class FrameworkCost:
    """One framework's host work beyond plain torch's, per rank (2 gloo ranks); a unit is ``UNIT``'s."""

    microbatch_unit_s: float
    """Seconds per unit per micro-batch (forward and backward), whatever its size."""
    microbatch_byte_s: float
    """Seconds per byte of (full, unsharded) parameters per micro-batch."""
    step_unit_s: float
    """Seconds per unit at the optimizer boundary beyond a micro-batch (epilogue, optimizer, refresh)."""
    step_byte_s: float
    """Seconds per parameter byte at the optimizer boundary (the optimizer step itself included)."""

    def __post_init__(self) -> None:
        values = (self.microbatch_unit_s, self.microbatch_byte_s, self.step_unit_s, self.step_byte_s)
        if not all(isinstance(v, (int, float)) and v >= 0 for v in values):
            raise ValueError(f"framework costs must be numbers >= 0 (a negative slope is clamped when "
                             f"measured), got {self!r}")


@dataclass(frozen=True, kw_only=True)
class FrameworkOps:
    """Every framework's ``FrameworkCost`` (by name, ``FRAMEWORKS``) and how they were measured."""

    costs: dict[str, FrameworkCost] = field(hash=False)
    """Not hashed (a dict): the hash of a profile that holds it comes from its other fields."""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        missing = sorted(set(FRAMEWORKS) - set(self.costs))
        if missing:
            raise ValueError(f"framework costs missing for {missing}: re-run `python -m bench.modelled.framework_ops`")


def _block(width: int):
    from torch import nn

    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Linear(width, width))


def _stack(width: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*(_block(width) for _ in range(BLOCKS)))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _adamw(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def _reference(model):
    """Plain torch, no optimizer: what every framework's cost is measured beyond (so a framework's
    boundary cost includes its optimizer step)."""

    def forward_backward(x, boundary: bool):
        model(x).square().sum().backward()
        if boundary:
            model.zero_grad(set_to_none=True)

    return forward_backward


def _with_adamw(model):
    optimizer = _adamw(model.parameters())

    def forward_backward(x, boundary: bool):
        model(x).square().sum().backward()
        if boundary:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return forward_backward


def _fsdp(model):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = CPUOffloadPolicy(pin_memory=False)
    for unit in sharded_units(model):
        fully_shard(unit, mesh=mesh, offload_policy=policy)
    return _with_adamw(model)


def _deepspeed(stage: int):
    def build(model):
        import logging
        import os

        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed
        from deepspeed.utils import logger

        logger.setLevel(logging.WARNING)
        zero = {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        import torch.distributed as dist

        config = {"train_batch_size": MICROBATCHES * dist.get_world_size(), "train_micro_batch_size_per_gpu": 1,
                  "gradient_accumulation_steps": MICROBATCHES,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                             "weight_decay": 0.0}},
                  "zero_optimization": zero, "steps_per_print": 10**9, "wall_clock_breakdown": False}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                          dist_init_required=False)

        def forward_backward(x, boundary: bool):
            engine.backward(engine(x).square().sum())
            engine.step()  # the optimizer runs at the accumulation boundary only

        return forward_backward

    return build


BUILDERS = {"plain": _reference, "zero3-offload": _deepspeed(3), "zero2-offload": _deepspeed(2), "fsdp2-offload": _fsdp}


def _worker(rank: int, framework: str, width: int) -> tuple[float, float]:
    """(median CPU s of a non-boundary micro-batch, median CPU s of the boundary one) on this rank."""
    import torch
    import torch.distributed as dist

    run = BUILDERS[framework](_stack(width))
    x = torch.randn(1, TOKENS, width)
    inner, boundary = [], []
    for step in range(WARMUP + STEPS):
        for j in range(MICROBATCHES):
            last = j == MICROBATCHES - 1
            dist.barrier()
            start = _cpu_s()
            run(x, last)
            spent = _cpu_s() - start
            if step >= WARMUP:
                (boundary if last else inner).append(spent)
    dist.barrier()
    return statistics.median(inner), statistics.median(boundary)


def measure_one(framework: str, width: int) -> tuple[float, float]:
    """Both ranks' medians, averaged: (micro-batch s, boundary s)."""
    from bubbleless_runtime import spawn

    per_rank = spawn(_worker, 2, framework, width, threads_per_process=1, timeout=600)
    return tuple(statistics.fmean(r[i] for r in per_rank) for i in range(2))


def costs_from_timings(timings: dict[tuple[str, int], tuple[float, float]], *, framework: str) -> FrameworkCost:
    """A framework's fixed and per-byte costs from its and plain torch's timings at ``WIDTHS``: per width,
    extra = framework - plain; the per-byte slope between the widths (clamped at 0) over the stack's
    parameter bytes, and the fixed cost at the narrow width less the slope's share (clamped at 0), per
    ``UNIT`` of the stack (``units_of``: 33 modules, 48 tensors, 9 ``fully_shard`` units)."""
    (narrow, wide) = WIDTHS
    size = {w: param_bytes_of(_stack(w)) for w in WIDTHS}
    units = units_of(_stack(narrow))[UNIT[framework]]

    def line(index: int) -> tuple[float, float]:
        extra = {w: timings[(framework, w)][index] - timings[("plain", w)][index] for w in WIDTHS}
        if index == 1:  # the boundary's own extra: less its micro-batch's
            extra = {w: extra[w] - (timings[(framework, w)][0] - timings[("plain", w)][0]) for w in WIDTHS}
        per_byte = max(0.0, (extra[wide] - extra[narrow]) / (size[wide] - size[narrow]))
        fixed = max(0.0, extra[narrow] - per_byte * size[narrow])
        return fixed / units, per_byte

    (mb_fixed, mb_byte), (step_fixed, step_byte) = line(0), line(1)
    return FrameworkCost(microbatch_unit_s=_figures(mb_fixed), microbatch_byte_s=_figures(mb_byte),
                         step_unit_s=_figures(step_fixed), step_byte_s=_figures(step_byte))


def _figures(value: float) -> float:
    return float(f"{value:.4g}")


def measure_framework_ops(progress=print) -> FrameworkOps:
    import torch

    timings = {}
    for framework in ("plain", *FRAMEWORKS):
        for width in WIDTHS:
            timings[(framework, width)] = measure_one(framework, width)
            progress(f"{framework} width {width}: micro-batch {timings[(framework, width)][0] * 1e3:.2f} ms, "
                     f"boundary {timings[(framework, width)][1] * 1e3:.2f} ms CPU per rank")
    source = (f"process CPU time per rank (getrusage, all threads), 2 gloo ranks x 1 thread, torch "
              f"{torch.__version__}; {BLOCKS} blocks (LayerNorm + 2 Linear with bias) at widths {list(WIDTHS)}, "
              f"{TOKENS} tokens, {MICROBATCHES} micro-batches a step, median of {STEPS} steps after {WARMUP}; "
              f"beyond the same stack in plain torch (bench/modelled/framework_ops.py); raw ms per rank "
              + ", ".join(f"{f}@{w}: {a * 1e3:.2f}/{b * 1e3:.2f}" for (f, w), (a, b) in timings.items()))
    return FrameworkOps(costs={f: costs_from_timings(timings, framework=f) for f in FRAMEWORKS}, source=source)


def framework_ops_to_dict(ops: FrameworkOps) -> dict:
    return {"value": {f: {k: getattr(c, k) for k in FrameworkCost.__dataclass_fields__} for f, c in ops.costs.items()},
            "source": ops.source}


def framework_ops_from_dict(data: dict) -> FrameworkOps:
    try:
        return FrameworkOps(costs={f: FrameworkCost(**c) for f, c in data["value"].items()}, source=data["source"])
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"a framework entry needs {{value: {{framework: costs}}, source}}: {error}; re-run "
                         f"`python -m bench.modelled.framework_ops`") from error


def main() -> None:
    from .ops_entry import write_ops_entry

    write_ops_entry("framework", lambda: framework_ops_to_dict(measure_framework_ops()))


if __name__ == "__main__":
    main()
