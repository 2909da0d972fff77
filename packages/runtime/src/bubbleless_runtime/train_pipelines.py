"""What ``bubbleless train`` trains: the model of the config, cut into a pipeline of ranks or a device pool,
and what a resumed run takes from its checkpoint (the cut, the schedule) and its timeouts.

``train_loop.py`` runs the steps over what these build; ``cli.py`` calls ``check_reliability`` and
``reuse_checkpoint_cut`` before any process starts, so a bad setting ends the run with one message.
"""

from __future__ import annotations

import os

from .config import RunConfig
from .config_checks import is_schedule_path, pool_groups_of, schedule_from_file


def check_reliability(config: RunConfig) -> None:
    """The timeouts and checkpoint settings, ``train.resume`` resolved to a complete checkpoint (``latest``
    and a run directory: the one named, on a line of its own), and ``warn_of_later_checkpoints``."""
    from . import checkpoint_files

    p, t = config.pipeline, config.train
    for key, value in (("pipeline.timeout", p.timeout), ("pipeline.first_step_timeout", p.first_step_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"{key} is in seconds and must be positive, got {value!r}")
    if isinstance(t.keep_checkpoints, bool) or not isinstance(t.keep_checkpoints, int) or t.keep_checkpoints < 0:
        raise ValueError(f"train.keep_checkpoints must be 0 (keep all) or a positive count, got {t.keep_checkpoints!r}")
    if t.resume:
        given, t.resume = t.resume, checkpoint_files.resolve(t.resume, t.output_dir)
        if given != t.resume and _rank_zero():
            print(f"resume: {given} is {t.resume}")
    warn_of_later_checkpoints(config)


def _rank_zero() -> bool:
    """Whether this process speaks for the run: the one ``bubbleless train`` process, or torchrun's rank 0."""
    return os.environ.get("RANK", "0") == "0"


def warn_of_later_checkpoints(config: RunConfig) -> None:
    """A UserWarning (rank 0) when this run will write checkpoints into an ``output_dir`` that already holds
    complete ones of a higher step than it starts from: an earlier run's, which step numbers alone would
    take for the newest (``checkpoint_files``: ``latest`` and pruning go by what was written last)."""
    import warnings

    from . import checkpoint_files

    t = config.train
    if not (t.checkpoint or t.save_every) or not _rank_zero():
        return
    start = checkpoint_files.check_complete(t.resume)["step"] if t.resume else 0
    later = [os.path.basename(path) for step, path in checkpoint_files.complete_checkpoints(t.output_dir)
             if step > start]
    if later:
        warnings.warn(
            f"train.output_dir {t.output_dir} already holds {', '.join(later)}, of later steps than this run starts "
            f"from (step {start}): this run's checkpoints go beside them, train.keep_checkpoints prunes by when "
            "checkpoints were written, and --resume latest takes the checkpoint written last (this run's newest), "
            "not the highest step; use another --output-dir to keep runs apart",
            UserWarning, stacklevel=2,
        )


def reuse_checkpoint_cut(config: RunConfig) -> None:
    """Resuming ``partition: auto``: take the checkpoint's cut instead of profiling again, which may cut
    elsewhere and would then be refused (``checkpoint.check_partition``); ``resumed_schedule`` then
    takes the schedule the checkpoint ran, generated for the profile it was cut by."""
    p = config.pipeline
    if not config.train.resume or p.partition != "auto":
        return
    from .checkpoint import cut_text, manifest_of

    cut = manifest_of(config.train.resume).get("partition")
    if cut is not None:
        p.partition, p.memory_cap = cut, None
        print(f"resume: partition auto takes the checkpoint's cut {cut_text(cut)} (not profiled again)")


def resumed_schedule(config: RunConfig):
    """Resuming: the ``Schedule`` the checkpoint ran when it is the one configured and the cut is the
    checkpoint's (``partition: auto`` may have generated it for its profile); else None: generate it."""
    if not config.train.resume:
        return None
    from bubbleless_schedules import Schedule

    from .checkpoint import manifest_of

    manifest = manifest_of(config.train.resume)
    saved = manifest.get("schedule")
    if not saved or saved.get("name") != config.pipeline.schedule or manifest.get("partition") != config.pipeline.partition:
        return None
    return Schedule.from_text(saved["text"])


def first_step_timeout(config: RunConfig) -> float:
    """Seconds the first step's waits (process start, profiling, first transfers) may take."""
    p = config.pipeline
    return 4.0 * p.timeout if p.first_step_timeout is None else p.first_step_timeout


def steady_timeouts(config: RunConfig) -> None:
    """After the first step: the default process group's blocking collectives wait ``pipeline.timeout``
    (they were given ``first_step_timeout`` to start); the pipeline's own waits switch by themselves."""
    import datetime

    import torch.distributed as dist

    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch >= 2.3
    if set_timeout is not None and dist.is_initialized():
        set_timeout(datetime.timedelta(seconds=config.pipeline.timeout))


def device_of(config: RunConfig, rank: int):
    """The torch device this rank's stages run on (``train.device``; under torchrun its ``LOCAL_RANK``'s GPU)."""
    import torch

    if config.train.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no GPU is visible; set train.device: cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # the GPU init_from_env selected under torchrun
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def build_model(config: RunConfig):
    """The model of ``config.model`` (``models.ARCHITECTURES`` is the one table), LoRA applied, cut."""
    from .lora import apply_lora
    from .models import model_from_config, pipeline_model

    model, aux = model_from_config(config.model, seed=config.train.seed)
    if config.lora.enabled:
        lora = config.lora
        model = apply_lora(
            model, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules
        )
    return pipeline_model(model, aux_loss_coef=aux)


def configured_schedule(config: RunConfig):
    """``pipeline.schedule``: a name, or the ``Schedule`` read (and validated) from its CSV path."""
    name = config.pipeline.schedule
    return schedule_from_file(name) if is_schedule_path(name) else name


def stage_pipeline(config: RunConfig, piped, loss, sample_input, *, rank: int, schedule=None):
    """The multi-process ``Pipeline``: this rank's stages on this rank's device (``schedule``: a
    ``Schedule`` to run instead of generating ``pipeline.schedule``, e.g. a resumed checkpoint's)."""
    from .pipeline import Pipeline

    device = device_of(config, rank)
    for layer in piped.layers:
        layer.to(device)
    return Pipeline(
        piped.layers,
        schedule=configured_schedule(config) if schedule is None else schedule,
        num_microbatches=config.pipeline.num_microbatches,
        loss_fn=loss,
        partition=config.pipeline.partition,
        # partition: auto profiles on the first step's first micro-batch (rank 0 measures, all ranks cut)
        sample_input=sample_input,
        memory_cap=config.pipeline.memory_cap,
        device=device,
        timeout=config.pipeline.timeout,
        first_step_timeout=first_step_timeout(config),
        trace=True,  # the report reads last_timeline once, on every rank, after the last step
    )


def host_optimizer_settings(config: RunConfig, loss_scaler=None) -> dict:
    """The pool's host optimizer (``RoundRobinPipeline(optimizer=...)``) from ``optimizer.*``: the same
    optimizer, groups and clipping as ``trainer.build_optimizer`` and the Trainer's, stepped over the fp32
    masters in host memory; one step stale with ``optimizer.asynchronous``. ``loss_scaler``: the Trainer's
    fp16 scaler (it unscales and skips there), None without fp16."""
    o = config.optimizer
    return {
        "name": o.name, "lr": o.lr, "betas": tuple(o.betas), "eps": o.eps, "weight_decay": o.weight_decay,
        "momentum": o.momentum, "max_grad_norm": o.max_grad_norm or 0.0, "loss_scaler": loss_scaler,
        "asynchronous": o.asynchronous,
    }  # fmt: skip


def pool_pipeline(config: RunConfig, piped, loss, sample_input, loss_scaler=None, data_parallel_group=None):
    """The ``RoundRobinPipeline`` over ``pipeline.devices``; the layers stay on the host (its store), and
    its host optimizer steps them (``host_optimizer_settings``). ``data_parallel_group``: the replicas its
    gradients are averaged with (``run_pool`` under torchrun)."""
    from .pool import RoundRobinPipeline

    p = config.pipeline
    return RoundRobinPipeline(
        piped.layers,
        devices=p.devices,
        schedule=p.schedule,
        num_microbatches=p.num_microbatches,
        loss_fn=loss,
        partition=pool_groups_of(p.partition),
        sample_input=sample_input,  # partition: auto times the layers on the first step's first micro-batch
        memory_budget=p.memory_budget,
        pin_memory=p.pin_memory,
        weight_uploads=p.weight_uploads,
        # the one precision the trainer steps in (train.precision's names are the pool's): an automatic plan
        # then holds room for what that precision saves alone, not the most of fp32, bf16 and fp16
        precision=config.train.precision,
        optimizer=host_optimizer_settings(config, loss_scaler),
        trace=True,
        data_parallel_group=data_parallel_group,
    )
