"""Checks on a ``RunConfig`` that need no process: every bad value is a ``ValueError`` naming the field.

``validate`` runs when a config is loaded: the allowed names (read from the tables that implement
them, so a new optimizer or architecture is one table entry), positive sizes, the schedule name, a
partition list against the model's layer count. ``check_schedule`` generates the schedule for the
rank count the run will have (pipeline.nproc, or torchrun's world size), so a schedule that cannot run
on this pipeline or a partition with the wrong stage count fails before any process starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import PipelineConfig, RunConfig

DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")


def choices() -> dict[tuple[str, str], tuple[str, ...]]:
    """(section, field) -> accepted values, from the tables that give each value its meaning."""
    from .data import TASKS
    from .models.hf import ARCHITECTURES
    from .trainer import AUTOCAST_DTYPES, OPTIMIZERS

    return {
        ("model", "architecture"): tuple(ARCHITECTURES),
        ("data", "task"): tuple(TASKS),
        ("optimizer", "name"): tuple(OPTIMIZERS),
        ("train", "precision"): tuple(AUTOCAST_DTYPES),
        ("train", "device"): DEVICES,
        ("pipeline", "backend"): BACKENDS,
    }


POSITIVE = (
    ("data", "batch_size"), ("data", "length"), ("data", "num_symbols"), ("pipeline", "nproc"),
    ("pipeline", "num_microbatches"), ("train", "steps"), ("train", "grad_accum"), ("model", "num_layers"),
)  # fmt: skip


def validate(config: RunConfig) -> RunConfig:
    """Raise ValueError for values that cannot work together, naming the field to change."""
    for (section, name), allowed in choices().items():
        value = getattr(getattr(config, section), name)
        if value not in allowed:
            raise ValueError(f"{section}.{name} is {value!r}; choose one of {list(allowed)}")
    for section, name in POSITIVE:
        if getattr(getattr(config, section), name) < 1:
            raise ValueError(f"{section}.{name} must be at least 1")
    _validate_schedule_name(config.pipeline.schedule)
    _validate_partition(config.pipeline, pipeline_layers(config))
    if config.data.batch_size % config.pipeline.num_microbatches:
        raise ValueError(
            f"data.batch_size {config.data.batch_size} is not divisible by pipeline.num_microbatches "
            f"{config.pipeline.num_microbatches}; make the batch a multiple of the micro-batch count"
        )
    if config.model.path is None and config.model.vocab_size < config.data.num_symbols + 3:
        raise ValueError(
            f"model.vocab_size {config.model.vocab_size} is too small for data.num_symbols "
            f"{config.data.num_symbols}; make it at least {config.data.num_symbols + 3}"
        )
    return config


def pipeline_layers(config: RunConfig) -> int | None:
    """Layers the pipeline cuts (decoder layers + embedding + norm/LM head); None for a model loaded
    from ``model.path``, whose depth the config does not say."""
    return None if config.model.path is not None else config.model.num_layers + 2


def _validate_schedule_name(name: str) -> None:
    from bubbleless_schedules import aliases, available

    if name not in available() and name not in aliases():
        alias_text = ", ".join(f"{alias}={target}" for alias, target in aliases().items())
        raise ValueError(
            f"pipeline.schedule is {name!r}; choose one of {available()} (aliases: {alias_text})"
        )


def _validate_partition(pipeline: PipelineConfig, num_layers: int | None) -> None:
    partition = pipeline.partition
    if isinstance(partition, str) and partition not in ("even", "auto"):
        raise ValueError(f"pipeline.partition is {partition!r}; use even, auto or a list of layers per stage")
    if isinstance(partition, list):
        if any(n < 1 for n in partition):
            raise ValueError(f"pipeline.partition {partition} has a stage with no layers; give each at least 1")
        if num_layers is not None and sum(partition) != num_layers:
            raise ValueError(
                f"pipeline.partition {partition} covers {sum(partition)} layers but the model has {num_layers} "
                f"(model.num_layers + 2: the embedding and the norm + LM head); make the counts sum to {num_layers}"
            )
    if pipeline.memory_cap is not None and pipeline.partition != "auto":
        raise ValueError("pipeline.memory_cap applies to pipeline.partition: auto only; set both or drop memory_cap")
    if pipeline.memory_cap is not None and not pipeline.memory_cap > 0:
        raise ValueError(f"pipeline.memory_cap must be a positive number of bytes, got {pipeline.memory_cap!r}")


def check_schedule(config: RunConfig, *, num_ranks: int) -> None:
    """Generate ``pipeline.schedule`` for ``num_ranks`` ranks: it must exist for that shape, bind its
    stages to ranks, and have as many stages as a partition list, and as the model has layers at least."""
    from bubbleless_schedules import generate

    from .pipeline import require_stage_bound

    pipeline = config.pipeline
    try:
        schedule = generate(pipeline.schedule, num_ranks=num_ranks, num_microbatches=pipeline.num_microbatches)
    except ValueError as error:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule!r} cannot run on {num_ranks} ranks with "
            f"{pipeline.num_microbatches} micro-batches: {error}"
        ) from error
    require_stage_bound(schedule)
    if isinstance(pipeline.partition, list) and len(pipeline.partition) != schedule.num_stages:
        raise ValueError(
            f"pipeline.partition {pipeline.partition} gives {len(pipeline.partition)} stages but "
            f"{pipeline.schedule} on {num_ranks} ranks has {schedule.num_stages}; give one layer count per stage"
        )
    num_layers = pipeline_layers(config)
    if num_layers is not None and num_layers < schedule.num_stages:
        raise ValueError(
            f"{pipeline.schedule} on {num_ranks} ranks has {schedule.num_stages} stages but the model has "
            f"{num_layers} layers; raise model.num_layers to at least {schedule.num_stages - 2}, or run fewer ranks"
        )


def check_device(config: RunConfig) -> None:
    """``train.device: cuda`` and ``pipeline.backend: nccl`` need a visible GPU: say so before any process
    starts, rather than from every rank's traceback."""
    if config.train.device != "cuda" and config.pipeline.backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        field = "train.device is 'cuda'" if config.train.device == "cuda" else "pipeline.backend is 'nccl'"
        raise ValueError(f"{field} but no GPU is visible here; set train.device: cpu and pipeline.backend: gloo")
