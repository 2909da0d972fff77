"""``bubbleless train [CONFIG.yaml]``: train a model over a pipeline of local processes (or torchrun's).

Without a config it runs the embedded default (``default_config.py``): a small Qwen3-architecture model
learning to sort symbol strings, 4 CPU ranks, the zbv schedule, one to two minutes. Rank 0 shows a
progress bar and ends with the loss drop, tokens/s, the bubble rate measured from the run's own trace
beside the simulator's prediction, and the paths of a timeline PNG and a Chrome trace of the real run.

``pipeline.schedule: roundrobin`` (``--example roundrobin``: ``roundrobin_config.py``) trains in this
process instead, on a ``RoundRobinPipeline`` over ``pipeline.devices`` (one thread per device, the
training state in host memory), through the same Trainer, checkpoints and report.
"""

from __future__ import annotations

import argparse
import os
import sys

from .config import RunConfig, config_to_dict, load_config
from .config_checks import (
    check_schedule,
    is_schedule_path,
    pool_groups_of,
    schedule_from_file,
    uses_pool,
    validate,
)
from .config_runtime import check_before_run
from .default_config import DEFAULT_CONFIG_YAML
from .fetch_model import add_fetch_parser, run_fetch
from .generate import add_generate_parser, run_generate
from .launch import under_torchrun
from .metrics import open_metrics
from .report import RunResult, finish, pool_partition_effect, report
from .roundrobin_config import ROUNDROBIN_CONFIG_YAML
from .signals import RunInterrupted, StopRequest, deferred_stop, signal_name
from .smollm2_config import smollm2_lora_yaml

# --example NAME -> the embedded config it runs
EXAMPLES: dict[str, str] = {
    "default": DEFAULT_CONFIG_YAML, "roundrobin": ROUNDROBIN_CONFIG_YAML, "smollm2-lora": smollm2_lora_yaml(),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bubbleless", description="Pipeline-parallel training.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model over a pipeline (default: the embedded demo)")
    train.add_argument(
        "config", nargs="?",
        help="YAML config; omitted: the embedded default. --print-config shows every field with its value; "
             "python -m bubbleless_runtime.config_docs prints the reference page of what each one means",
    )
    train.add_argument(
        "--example", choices=list(EXAMPLES),
        help="run an embedded example config instead of a file: default (4 CPU ranks, zbv; the same as no "
             "config), roundrobin (a pool of 4 CPU devices in one process) or smollm2-lora (LoRA fine-tuning of "
             "SmolLM2-135M on shipped instruction chats; first run bubbleless fetch-example-model smollm2-135m)",
    )
    train.add_argument("--nproc", type=int, help="local ranks to spawn (overrides pipeline.nproc)")
    train.add_argument("--steps", type=int, help="optimizer steps (overrides train.steps)")
    train.add_argument("--schedule", help="schedule name (overrides pipeline.schedule)")
    train.add_argument(
        "--output-dir", help="where the PNG, trace and checkpoints go (overrides train.output_dir)"
    )
    train.add_argument("--resume", help="checkpoint directory to resume from (overrides train.resume)")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    add_generate_parser(commands)
    add_fetch_parser(commands)
    return parser


# command-line flag -> (config section, field)
OVERRIDES: dict[str, tuple[str, str]] = {
    "nproc": ("pipeline", "nproc"),
    "steps": ("train", "steps"),
    "schedule": ("pipeline", "schedule"),
    "output_dir": ("train", "output_dir"),
    "resume": ("train", "resume"),
}


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """The config file (or an embedded example, the default one without either) with the command-line
    overrides applied."""
    if args.config and args.example:
        raise ValueError(f"give a config file or --example {args.example}, not both")
    config = load_config(args.config) if args.config else load_config(text=EXAMPLES[args.example or "default"])
    for flag, (section, name) in OVERRIDES.items():
        value = getattr(args, flag)
        if value is not None:
            setattr(getattr(config, section), name, value)
    return validate(config)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "fetch-example-model":
        return run_fetch(args)
    try:
        config = resolve_config(args)
        pool = uses_pool(config.pipeline.schedule)
        if pool and under_torchrun():
            raise ValueError(
                f"pipeline.schedule {config.pipeline.schedule} runs in one process (a thread per device of "
                "pipeline.devices); run `bubbleless train` without torchrun"
            )
        if not args.print_config:  # before any process starts: the schedule, its shape and the partition
            num_ranks = int(os.environ["WORLD_SIZE"]) if under_torchrun() else config.pipeline.nproc
            _check_reliability(config)
            _reuse_checkpoint_cut(config)
            check_schedule(config, num_ranks=num_ranks)
            check_before_run(config, num_ranks=num_ranks)  # output_dir, GPU, LoRA targets, memory_cap
    except ValueError as error:
        print(f"bubbleless: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
        return 0
    from .launch import RankFailure

    try:
        if pool:
            run_pool(config)
        elif under_torchrun():  # this process is one rank
            run_rank(config)
            _end_rank_process()
        else:
            launch(config)
    except RunInterrupted as stopped:  # SIGTERM or Ctrl-C: the message says what was saved
        print(f"bubbleless: {stopped}", file=sys.stderr)
        if under_torchrun():
            _end_rank_process(stopped.exit_code)
        return stopped.exit_code
    except RankFailure as failure:  # a rank died or stalled: its traceback, if any, is in its own output
        print(f"bubbleless: {failure}", file=sys.stderr)
        return 1
    return 0


def _check_reliability(config: RunConfig) -> None:
    """The timeouts and checkpoint settings, and ``train.resume`` resolved to a complete checkpoint."""
    from . import checkpoint_files

    p, t = config.pipeline, config.train
    for key, value in (("pipeline.timeout", p.timeout), ("pipeline.first_step_timeout", p.first_step_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"{key} is in seconds and must be positive, got {value!r}")
    if isinstance(t.keep_checkpoints, bool) or not isinstance(t.keep_checkpoints, int) or t.keep_checkpoints < 0:
        raise ValueError(f"train.keep_checkpoints must be 0 (keep all) or a positive count, got {t.keep_checkpoints!r}")
    if t.resume:
        t.resume = checkpoint_files.resolve(t.resume, t.output_dir)


def _reuse_checkpoint_cut(config: RunConfig) -> None:
    """Resuming ``partition: auto``: take the checkpoint's cut instead of profiling again, which may cut
    elsewhere and would then be refused (``checkpoint.check_partition``); ``_resumed_schedule`` then
    takes the schedule the checkpoint ran, generated for the profile it was cut by."""
    p = config.pipeline
    if not config.train.resume or p.partition != "auto":
        return
    from .checkpoint import cut_text, manifest_of

    cut = manifest_of(config.train.resume).get("partition")
    if cut is not None:
        p.partition, p.memory_cap = cut, None
        print(f"resume: partition auto takes the checkpoint's cut {cut_text(cut)} (not profiled again)")


def _resumed_schedule(config: RunConfig):
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


def _first_step_timeout(config: RunConfig) -> float:
    p = config.pipeline
    return 4.0 * p.timeout if p.first_step_timeout is None else p.first_step_timeout


def _steady_timeouts(config: RunConfig) -> None:
    """After the first step: the default process group's blocking collectives wait ``pipeline.timeout``
    (they were given ``first_step_timeout`` to start); the pipeline's own waits switch by themselves."""
    import datetime

    import torch.distributed as dist

    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # torch >= 2.3
    if set_timeout is not None and dist.is_initialized():
        set_timeout(datetime.timedelta(seconds=config.pipeline.timeout))


def _end_rank_process(code: int = 0) -> None:
    """End a torchrun rank after a finished run without Python's interpreter finalization.

    ProcessGroupGloo's worker threads drop a finished collective (and the Python tensors it holds) a
    moment after ``wait`` has returned in the main thread. When that moment falls inside finalization,
    the worker dies taking the GIL and the process aborts: a core dump of such a rank shows
    ``AsyncAllgatherWork::~AsyncAllgatherWork`` -> ``take_gil`` -> ``pthread_exit`` -> ``std::terminate``.
    torchrun then reports a failed run after a successful one (about one run in 20 on a loaded 2-core
    machine). Everything is written by now; flush and leave with ``code``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(config: RunConfig) -> None:
    """Start ``pipeline.nproc`` local processes, each one pipeline rank (one process: no spawning)."""
    nproc = config.pipeline.nproc
    if nproc == 1:
        run_rank(config)
        return
    from .launch import spawn

    # the group's own timeout bounds blocking collectives (the Trainer's all-reduces) like the pipeline's
    # transfers: first_step_timeout while ranks start and run their first step, then pipeline.timeout
    # (_steady_timeouts), so a stalled rank ends the run within it wherever the others wait for it
    spawn(_spawned_rank, nproc, config, backend=config.pipeline.backend, pg_timeout=_first_step_timeout(config))


def _spawned_rank(rank: int, config: RunConfig) -> None:
    """One child of ``launch.spawn`` (which has joined the process group already)."""
    run_rank(config)


# ---- one rank of the job ----


def run_rank(config: RunConfig) -> RunResult:
    """Build the model, the pipeline and the trainer on this rank, train, and report on rank 0."""
    import torch
    import torch.distributed as dist

    from .launch import init_from_env

    created = dist.is_available() and under_torchrun() and not dist.is_initialized()
    if created:  # torchrun: we join the group (and pick this process's GPU); under launch.spawn it exists
        init_from_env(backend=config.pipeline.backend, timeout=_first_step_timeout(config))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if under_torchrun():  # torchrun sets the world; pipeline.nproc is ignored (and reported as it ran)
        config.pipeline.nproc = dist.get_world_size()
    # the CPU cores are shared by the processes on this machine, not by the whole (multi-node) world
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size() if dist.is_initialized() else 1))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    try:
        with deferred_stop() as stop:
            return _train(config, rank=rank, stop=stop)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


def run_pool(config: RunConfig) -> RunResult:
    """Train on the round-robin device pool in this process (no ranks, no process group)."""
    import torch

    cpus = os.cpu_count() or 1
    if all(d == "cpu" for d in config.pipeline.devices):
        # each device thread runs its ops at the same time as the others, and torch's intra-op pool is
        # per calling thread (an OpenMP team each): split the cores between them, as ranks do
        torch.set_num_threads(max(1, cpus // len(config.pipeline.devices)))
    else:  # the device threads mostly launch kernels; the host optimizer's CPU kernels get every core
        torch.set_num_threads(cpus)
    with deferred_stop() as stop:
        return _train(config, rank=0, stop=stop)


def _device(config: RunConfig, rank: int):
    import torch

    if config.train.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("train.device is 'cuda' but no GPU is visible; set train.device: cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # the GPU init_from_env selected under torchrun
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def _build_model(config: RunConfig):
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


def _configured_schedule(config: RunConfig):
    """``pipeline.schedule``: a name, or the ``Schedule`` read (and validated) from its CSV path."""
    name = config.pipeline.schedule
    return schedule_from_file(name) if is_schedule_path(name) else name


def _stage_pipeline(config: RunConfig, piped, loss, sample_input, *, rank: int, schedule=None):
    """The multi-process ``Pipeline``: this rank's stages on this rank's device (``schedule``: a
    ``Schedule`` to run instead of generating ``pipeline.schedule``, e.g. a resumed checkpoint's)."""
    from .pipeline import Pipeline

    device = _device(config, rank)
    for layer in piped.layers:
        layer.to(device)
    return Pipeline(
        piped.layers,
        schedule=_configured_schedule(config) if schedule is None else schedule,
        num_microbatches=config.pipeline.num_microbatches,
        loss_fn=loss,
        partition=config.pipeline.partition,
        # partition: auto profiles on the first step's first micro-batch (rank 0 measures, all ranks cut)
        sample_input=sample_input,
        memory_cap=config.pipeline.memory_cap,
        device=device,
        timeout=config.pipeline.timeout,
        first_step_timeout=_first_step_timeout(config),
        trace=True,  # the report reads last_timeline once, on every rank, after the last step
    )


def _pool_pipeline(config: RunConfig, piped, loss, sample_input):
    """The ``RoundRobinPipeline`` over ``pipeline.devices``; the layers stay on the host (its store)."""
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
        optimizer=None,  # .grad of the host parameters is filled; the Trainer's optimizer steps them
        trace=True,
    )


def _train(config: RunConfig, *, rank: int, stop: StopRequest | None = None) -> RunResult:
    import torch

    from .data_eval import sample_input_of, training_data
    from .save_hf import save_trained_model
    from .trainer import ScaledLoss, Trainer, build_optimizer, seed_everything, warmup_cosine

    seed_everything(config.train.seed)
    pool = uses_pool(config.pipeline.schedule)
    piped = _build_model(config)
    loss = ScaledLoss(piped.loss_fn)
    data, evaluation, data_summary = training_data(config, rank=rank)  # data.path, else the synthetic task
    if rank == 0 and data_summary:
        print(data_summary)
    auto = config.pipeline.partition == "auto"
    sample_input = sample_input_of(data, config.pipeline.num_microbatches) if auto else None
    if pool:
        pipeline = _pool_pipeline(config, piped, loss, sample_input)
    else:
        pipeline = _stage_pipeline(config, piped, loss, sample_input, rank=rank, schedule=_resumed_schedule(config))
    # For the pool, pipeline.parameters() are the host-resident parameters, and the HostStore's fp32
    # masters are those very tensors when the weights are fp32 (always, for a model built from sizes;
    # precision is autocast). So this torch optimizer stepping them with its CPU kernels IS the CPU
    # optimizer over fp32 masters that RoundPipe runs, and its state stays in host memory.
    optimizer = build_optimizer(pipeline.parameters(), config.optimizer)
    steps = config.train.steps
    schedule = warmup_cosine(
        warmup_steps=config.optimizer.warmup_steps,
        total_steps=steps,
        min_lr_ratio=config.optimizer.min_lr_ratio,
    )
    trainer = Trainer(
        pipeline=pipeline, layers=piped.layers, loss=loss, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
        num_microbatches=config.pipeline.num_microbatches, grad_accum=config.train.grad_accum,
        max_grad_norm=config.optimizer.max_grad_norm, precision=config.train.precision, group=pipeline.group,
        autocast_device=pipeline.devices[0].type if pool else None,
    )  # fmt: skip
    if config.train.resume:
        trainer.load(config.train.resume)
    out = config.train.output_dir
    if trainer.step >= steps:  # a finished run resumed: report it, train nothing, write nothing
        result = RunResult([], float("nan"), float("nan"), float("nan"), None, None, None, None, trainer.step)
        if rank == 0:
            print(report(result, config))
        return result
    losses, tokens, seconds, warm = [], 0, 0.0, False
    bar = _progress(rank, total=steps, initial=trainer.step)
    metrics = open_metrics(out, rank=rank, resume_step=trainer.step)  # out/metrics.jsonl, TensorBoard
    first = trainer.step
    while trainer.step < steps:
        stats = trainer.train_step(data)
        if trainer.step == first + 1:
            _steady_timeouts(config)
        losses.append(stats.loss)
        eval_loss = evaluation.run(trainer) if evaluation is not None and evaluation.due(trainer.step, steps) else None
        if bar is not None and eval_loss is not None:
            bar.write(f"step {trainer.step}: eval loss {eval_loss:.4f}")
        if metrics is not None:
            metrics.log_stats(stats, eval_loss=eval_loss)
        if warm or trainer.step == steps:  # the first step pays one-off setup; keep it out of tokens/s
            tokens, seconds = tokens + stats.tokens, seconds + stats.seconds
        warm = True
        if bar is not None and (trainer.step % config.train.log_every == 0 or trainer.step == steps):
            bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{tokens / max(seconds, 1e-9):,.0f}")
        if bar is not None:
            bar.update(1)
        every = config.train.save_every
        if every and trainer.step % every == 0 and trainer.step < steps:
            trainer.save(os.path.join(out, f"checkpoint-{trainer.step}"), keep=config.train.keep_checkpoints)
        if stop is not None and (signum := stop.agreed(pipeline.group)):  # all ranks stop after one step
            _stopped(config, trainer, signum, bar)
    if bar is not None:
        bar.close()
    if metrics is not None:
        metrics.close()
    checkpoint = None
    if config.train.checkpoint or config.train.save_every:
        checkpoint = trainer.save(os.path.join(out, f"checkpoint-{trainer.step}"), keep=config.train.keep_checkpoints)
    adapter = _save_adapter(config, piped.model, pipeline)
    saved_model = save_trained_model(config, piped.model, pipeline)  # train.save_model: OUT/model
    result = finish(rank, pipeline, losses, tokens / max(seconds, 1e-9), out, checkpoint, adapter, trainer.step)
    if rank == 0:
        print(report(result, config))
        if saved_model is not None:
            print(f"model dir     {saved_model}  (AutoModelForCausalLM.from_pretrained loads it)")
    if pool and pipeline.profile is not None:
        print(pool_partition_effect(pipeline))
    elif rank == 0 and pipeline.profile is not None:
        from .auto_partition import predicted_effect

        print(predicted_effect(pipeline.schedule, pipeline.profile, pipeline.partition,
                               baseline=pipeline.schedule_before_profile))
    return result


def _stopped(config: RunConfig, trainer, signum: int, bar) -> None:
    """A stop signal after this step: save a checkpoint when the run saves them, then RunInterrupted."""
    if bar is not None:
        bar.close()
    step, steps = trainer.step, config.train.steps
    where = "no checkpoint was saved (set train.checkpoint: true to save one when stopped)"
    if config.train.checkpoint or config.train.save_every:
        path = trainer.save(os.path.join(config.train.output_dir, f"checkpoint-{step}"),
                            keep=config.train.keep_checkpoints)
        where = f"checkpoint saved at {path}; continue with --resume latest"
    raise RunInterrupted(f"stopped by {signal_name(signum)} after step {step} of {steps}: {where}", signum)


def _progress(rank: int, *, total: int, initial: int):
    if rank != 0:
        return None
    import threading

    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing one, a semaphore the resource tracker then reports as
    # leaked (a warning after the run's last line) whenever this rank is killed: a thread lock suffices
    tqdm.set_lock(threading.RLock())
    return tqdm(total=total, initial=initial, desc="train", unit="step", dynamic_ncols=True)


def _save_adapter(config: RunConfig, model, pipeline) -> str | None:
    if not config.lora.enabled:
        return None
    from .lora import save_lora_adapter

    path = os.path.join(config.train.output_dir, "lora-adapter")
    return save_lora_adapter(model, path, owned=list(pipeline.parameters()), group=pipeline.group)


if __name__ == "__main__":  # torchrun --nproc-per-node N -m bubbleless_runtime.cli train CONFIG.yaml
    sys.exit(main())
