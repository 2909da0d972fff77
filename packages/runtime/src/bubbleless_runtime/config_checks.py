"""Checks on a ``RunConfig`` that need no process and no torch: every bad value is a ``ValueError``
naming the field.

``validate`` runs when a config is loaded: the allowed names, the ranges of the numbers
(``config_ranges``), the schedule name (or CSV path), a partition list (or a round-robin cut) against
the model's layer count, and which fields go with which kind of schedule (``pipeline.devices`` and the
other pool fields with ``roundrobin`` only). ``check_schedule`` generates (or reads) the schedule for
the rank count the run will have (pipeline.nproc, or torchrun's world size; for ``roundrobin`` the
devices), so a schedule that cannot run on this pipeline or a partition with the wrong stage count fails
before any process starts. The checks that need torch or the model (a visible GPU, LoRA targets, a
memory cap against the parameters) are ``config_runtime``'s.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from .config_ranges import check_ranges
from .data_files import check_data_config

if TYPE_CHECKING:
    from bubbleless_schedules import Schedule

    from .config_fields import PipelineConfig, RunConfig

DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")
# The names the implementing tables give meaning to (models.hf.ARCHITECTURES, data.TASKS,
# trainer.OPTIMIZERS and trainer.AUTOCAST_DTYPES); written out here so that checking a config imports
# no torch. test_rt_cli_config holds each equal to its table.
ARCHITECTURES = ("qwen3", "llama", "qwen3_moe", "qwen2", "mistral")
TASKS = ("copy", "reverse", "sort")
OPTIMIZERS = ("adamw", "adam", "sgd")
PRECISIONS = ("fp32", "bf16", "fp16")


def choices() -> dict[tuple[str, str], tuple[str, ...]]:
    """(section, field) -> accepted values."""
    return {
        ("model", "architecture"): ARCHITECTURES,
        ("data", "task"): TASKS,
        ("optimizer", "name"): OPTIMIZERS,
        ("train", "precision"): PRECISIONS,
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
    check_ranges(config)
    _validate_schedule_name(config.pipeline.schedule)
    if uses_pool(config.pipeline.schedule):
        _validate_pool(config)
        _validate_pool_partition(config.pipeline, pipeline_layers(config))
    else:
        _validate_stage_bound(config.pipeline)
        if config.optimizer.asynchronous:
            raise ValueError(
                f"optimizer.asynchronous runs the round-robin pool's host optimizer one step stale; "
                f"{config.pipeline.schedule} steps a torch optimizer on each rank: drop optimizer.asynchronous "
                "(or use pipeline.schedule: roundrobin)"
            )
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
    check_data_config(config)  # data_files: the data.* fields, model.dtype, train.eval_every
    return config


def pipeline_layers(config: RunConfig) -> int | None:
    """Layers the pipeline cuts (decoder layers + embedding + norm/LM head); None for a model loaded
    from ``model.path``, whose depth the config does not say."""
    return None if config.model.path is not None else config.model.num_layers + 2


def is_schedule_path(name: str) -> bool:
    """``pipeline.schedule`` names a CSV file rather than a registered schedule."""
    return name.endswith(".csv") or "/" in name or os.sep in name


@functools.cache
def _read_schedule(path: str, mtime: float) -> Schedule:
    from bubbleless_schedules import Schedule, validate

    try:
        return validate(Schedule.from_csv(path))
    except ValueError as error:
        raise ValueError(f"pipeline.schedule {path!r}: {error}") from None


def schedule_from_file(path: str) -> Schedule:
    """The validated schedule of a ``pipeline.schedule`` CSV path (read again when the file changes)."""
    if not os.path.isfile(path):
        raise ValueError(
            f"pipeline.schedule {path!r} is a path but no such file exists; give a CSV written by "
            f"Schedule.to_csv (or `bubbleless-schedules show NAME -p P -m M --csv FILE`), or a schedule name"
        )
    return _read_schedule(path, os.path.getmtime(path))


def _validate_schedule_name(name: str) -> None:
    from bubbleless_schedules import aliases, available

    if is_schedule_path(name):
        schedule_from_file(name)
        return
    if name not in available() and name not in aliases():
        alias_text = ", ".join(f"{alias}={target}" for alias, target in aliases().items())
        raise ValueError(
            f"pipeline.schedule is {name!r}; choose one of {available()} (aliases: {alias_text})"
        )


@functools.cache
def uses_pool(name: str) -> bool:
    """True for a schedule that dispatches stage jobs to a device pool (``roundrobin``) rather than binding
    stages to ranks. A generator's placement does not depend on the shape, so one small shape classifies
    it (as ``pipeline.stage_bound_names`` does); a shape it cannot generate counts as stage-bound, and
    ``check_schedule`` then says why it cannot run."""
    from bubbleless_schedules import generate

    if is_schedule_path(name):
        return False  # a CSV schedule runs on the stage-bound Pipeline; check_schedule refuses a pool one
    try:
        return generate(name, num_ranks=2, num_microbatches=8).stage_to_rank is None
    except (ValueError, NotImplementedError):
        return False


POOL_ONLY = ("devices", "memory_budget", "pin_memory", "weight_uploads")


def _validate_stage_bound(pipeline: PipelineConfig) -> None:
    for name in POOL_ONLY:
        if getattr(pipeline, name) is not None:
            raise ValueError(
                f"pipeline.{name} is for the round-robin device pool (pipeline.schedule: roundrobin); "
                f"{pipeline.schedule} runs one process per rank (pipeline.nproc): drop pipeline.{name}"
            )


def _validate_pool(config: RunConfig) -> None:
    """``roundrobin``: devices given and of one kind, a positive budget, nothing of the rank path."""
    pipeline = config.pipeline
    devices = pipeline.devices
    if not devices:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule} runs on a pool of devices: set pipeline.devices, e.g. "
            "[cpu, cpu, cpu, cpu] or [cuda:0, cuda:1]"
        )
    kinds = set()
    for device in devices:
        kind, _, index = device.partition(":")
        if kind not in DEVICES or (index and not index.isdigit()) or (kind == "cpu" and index):
            raise ValueError(f"pipeline.devices entry {device!r} is not a device; use cpu, cuda or cuda:N")
        kinds.add(kind)
    if len(kinds) > 1:
        raise ValueError(f"pipeline.devices {devices} mixes cpu and cuda; the pool's devices must be of one kind")
    if pipeline.memory_budget is not None and not pipeline.memory_budget > 0:
        raise ValueError(f"pipeline.memory_budget must be a positive number of bytes, got {pipeline.memory_budget!r}")
    if pipeline.memory_cap is not None:
        raise ValueError("pipeline.memory_cap bounds a stage-bound auto cut; for roundrobin set pipeline.memory_budget")
    _validate_weight_uploads(pipeline.weight_uploads or {})
    if config.train.device != "cpu":
        raise ValueError(
            "train.device is for stage-bound schedules; roundrobin keeps weights in host memory and runs on "
            "pipeline.devices: drop train.device (or set it to cpu)"
        )
    if config.optimizer.asynchronous and config.train.precision == "fp16":
        raise ValueError(
            "optimizer.asynchronous cannot use fp16's loss scaler (its scale would move while the next step's "
            "loss is scaled with it): set train.precision: bf16, or optimizer.asynchronous: false"
        )


WEIGHT_UPLOAD_KEYS = ("paced", "chunk_bytes", "window")


def _validate_weight_uploads(options: dict) -> None:
    """``pipeline.weight_uploads``: known keys, a bool and positive counts (checked again by WeightUploads)."""
    unknown = sorted(set(options) - set(WEIGHT_UPLOAD_KEYS))
    if unknown:
        raise ValueError(f"pipeline.weight_uploads has unknown key(s) {unknown}; the keys are "
                         f"{', '.join(WEIGHT_UPLOAD_KEYS)}")
    if not isinstance(options.get("paced", False), bool):
        raise ValueError(f"pipeline.weight_uploads.paced is {options['paced']!r}; use true or false")
    for key, least in (("chunk_bytes", "1 byte"), ("window", "1 chunk in flight")):
        value = options.get(key, 1)
        if isinstance(value, bool) or value < 1:
            raise ValueError(f"pipeline.weight_uploads.{key} is {value!r}; it needs at least {least}")


POOL_CUT_KEYS = ("forward", "last", "backward")


def _validate_pool_partition(pipeline: PipelineConfig, num_layers: int | None) -> None:
    partition = pipeline.partition
    example = "{forward: [3, 2], last: 2, backward: [1, 2, 2]}"
    if isinstance(partition, str):
        if partition not in ("even", "auto"):
            raise ValueError(f"pipeline.partition is {partition!r}; for roundrobin use even, auto or a cut {example}")
        return
    if isinstance(partition, list):
        raise ValueError(
            f"pipeline.partition {partition} is a list of layers per stage, a stage-bound cut; roundrobin cuts "
            f"forward and backward groups apart: give a mapping such as {example}"
        )
    keys = sorted(partition)
    if keys != sorted(POOL_CUT_KEYS):
        raise ValueError(f"pipeline.partition {partition} needs exactly the keys forward, last and backward, e.g. "
                         f"{example}")
    forward, last, backward = (partition[k] for k in POOL_CUT_KEYS)
    if not isinstance(last, int) or last < 1:
        raise ValueError(f"pipeline.partition.last is {last!r}; the fused last group needs a layer count >= 1")
    for key, counts in (("forward", forward), ("backward", backward)):
        if not isinstance(counts, list):
            raise ValueError(f"pipeline.partition.{key} is {counts!r}; give a list of layer counts, e.g. [3, 2]")
        if any(n < 1 for n in counts):
            raise ValueError(f"pipeline.partition.{key} {counts} has a group with no layers; give each at least 1")
    if sum(forward) != sum(backward):
        raise ValueError(
            f"pipeline.partition.forward {forward} covers {sum(forward)} layers but backward {backward} covers "
            f"{sum(backward)}; both cover the layers before the last group"
        )
    if num_layers is not None and sum(forward) + last != num_layers:
        raise ValueError(
            f"pipeline.partition covers {sum(forward) + last} layers (forward {sum(forward)} + last {last}) but "
            f"the model has {num_layers} (model.num_layers + 2: the embedding and the norm + LM head); make "
            f"forward and backward each sum to {num_layers - last}"
        )


def pool_groups_of(partition):
    """The ``PoolGroups`` of a ``pipeline.partition`` mapping (validated), else the string as given."""
    if not isinstance(partition, dict):
        return partition
    from bubbleless_schedules.roundrobin_layout import PoolGroups

    return PoolGroups(tuple(partition["forward"]), partition["last"], tuple(partition["backward"]))


def _validate_partition(pipeline: PipelineConfig, num_layers: int | None) -> None:
    partition = pipeline.partition
    if isinstance(partition, str) and partition not in ("even", "auto"):
        raise ValueError(f"pipeline.partition is {partition!r}; use even, auto or a list of layers per stage")
    if isinstance(partition, dict):
        raise ValueError(
            f"pipeline.partition {partition} is a round-robin cut (forward/last/backward groups); "
            f"{pipeline.schedule} binds stages to ranks: give a list of layers per stage, even or auto"
        )
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

    from .arguments import require_stage_bound

    pipeline = config.pipeline
    if uses_pool(pipeline.schedule):
        _check_pool_schedule(config)
        return
    if is_schedule_path(pipeline.schedule):
        schedule = _check_schedule_file(config, num_ranks)
    else:
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


def _check_schedule_file(config: RunConfig, num_ranks: int) -> Schedule:
    """A CSV ``pipeline.schedule``: made for this rank count and micro-batch count, and stage-bound."""
    pipeline = config.pipeline
    schedule = schedule_from_file(pipeline.schedule)
    if schedule.stage_to_rank is None:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule!r} is a device-pool schedule (layout {schedule.layout!r}); a CSV "
            f"schedule runs on the stage-bound pipeline only: use pipeline.schedule: roundrobin for the pool"
        )
    if schedule.num_ranks != num_ranks:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule!r} is for {schedule.num_ranks} ranks but the run has {num_ranks}; "
            f"set pipeline.nproc: {schedule.num_ranks} (or write the schedule for {num_ranks} ranks)"
        )
    if schedule.num_microbatches != pipeline.num_microbatches:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule!r} has {schedule.num_microbatches} micro-batches but "
            f"pipeline.num_microbatches is {pipeline.num_microbatches}; set pipeline.num_microbatches: "
            f"{schedule.num_microbatches}"
        )
    return schedule  # with partition: auto it is cut for, but run as written (never re-generated)


def _check_pool_schedule(config: RunConfig) -> None:
    """Generate the pool schedule for ``pipeline.devices`` with the configured cut (``auto``: the even one,
    for the shape), so a pool it cannot run on fails before the model is built."""
    from bubbleless_schedules import generate
    from bubbleless_schedules.roundrobin_layout import PoolGroups

    pipeline = config.pipeline
    options: dict = {}
    num_layers = pipeline_layers(config)
    if num_layers is not None:
        options["num_layers"] = num_layers
    groups = pool_groups_of(pipeline.partition)
    if isinstance(groups, PoolGroups):
        options.update(forward_stages=list(groups.forward), last_layers=groups.last,
                       backward_stages=list(groups.backward))
    devices = len(pipeline.devices)
    try:
        generate(pipeline.schedule, num_ranks=devices, num_microbatches=pipeline.num_microbatches, **options)
    except ValueError as error:
        raise ValueError(
            f"pipeline.schedule {pipeline.schedule!r} cannot run on {devices} devices with "
            f"{pipeline.num_microbatches} micro-batches and pipeline.partition {pipeline.partition}: {error}"
        ) from error
