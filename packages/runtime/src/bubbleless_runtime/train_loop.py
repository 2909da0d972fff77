"""The training loop of ``bubbleless train``: one rank of a pipeline (``run_rank``) or the device pool in
this process (``run_pool``), from the built model (``train_pipelines.py``) to the report.

Each step: the Trainer's optimizer step (on the pool, the pool's host optimizer: ``optimizer.asynchronous``
makes it one step stale, and the update in flight is applied before an evaluation, a checkpoint and the
end of training), evaluation when due, the step's line in ``metrics.jsonl``, the
progress bar, a checkpoint every ``train.save_every`` steps, and a stop signal honoured after the same
step on every rank. At the end: the last checkpoint, the LoRA adapter, the saved model and the report.
"""

from __future__ import annotations

import os

from .config import RunConfig
from .config_checks import uses_pool
from .launch import under_torchrun
from .metrics import open_metrics
from .report import RunResult, finish, pool_partition_effect, report
from .signals import RunInterrupted, StopRequest, deferred_stop, signal_name
from .train_pipelines import (
    build_model,
    first_step_timeout,
    pool_pipeline,
    resumed_schedule,
    stage_pipeline,
    steady_timeouts,
)


def run_rank(config: RunConfig) -> RunResult:
    """Build the model, the pipeline and the trainer on this rank, train, and report on rank 0."""
    import torch
    import torch.distributed as dist

    from .launch import init_from_env

    created = dist.is_available() and under_torchrun() and not dist.is_initialized()
    if created:  # torchrun: we join the group (and pick this process's GPU); under launch.spawn it exists
        init_from_env(backend=config.pipeline.backend, timeout=first_step_timeout(config))
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
    """Train on the round-robin device pool in this process; under torchrun, as one of the world's
    data-parallel pools (``pool_replicas``: one per process, each on its share of the batches, the host
    gradients averaged over a gloo group), rank 0 reporting and writing."""
    import torch
    import torch.distributed as dist

    from .launch import init_from_env

    created = dist.is_available() and under_torchrun() and not dist.is_initialized()
    if created:  # the replicas' group: gloo, the gradients being averaged live in host memory
        init_from_env(backend="gloo", timeout=first_step_timeout(config))
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    # the cores of this machine are shared by the pools on it (torchrun's processes per node)
    cpus = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if all(d == "cpu" for d in config.pipeline.devices):
        # each device thread runs its ops at the same time as the others, and torch's intra-op pool is
        # per calling thread (an OpenMP team each): split the cores between them, as ranks do
        torch.set_num_threads(max(1, cpus // len(config.pipeline.devices)))
    else:  # the device threads mostly launch kernels; the host optimizer's CPU kernels get every core
        torch.set_num_threads(cpus)
    try:
        with deferred_stop() as stop:
            return _train(config, rank=rank, stop=stop)
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


def _train(config: RunConfig, *, rank: int, stop: StopRequest | None = None) -> RunResult:
    import torch

    from .data_eval import sample_input_of, training_data
    from .save_hf import save_trained_model
    from .trainer import (
        DynamicLossScaler,
        ScaledLoss,
        Trainer,
        build_optimizer,
        seed_everything,
        warmup_cosine,
    )

    seed_everything(config.train.seed)  # the same initial weights on every rank (and replica)
    pool = uses_pool(config.pipeline.schedule)
    replicas = _pool_replicas() if pool else None
    piped = build_model(config)
    loss = ScaledLoss(piped.loss_fn)
    data, evaluation, data_summary = training_data(config, rank=rank)  # data.path, else the synthetic task
    if replicas is not None:  # each pool steps on its own batches
        import torch.distributed as dist

        from .pool_replicas import ReplicaShard

        data = ReplicaShard(data, rank, dist.get_world_size(replicas))
    if rank == 0 and data_summary:
        print(data_summary)
    auto = config.pipeline.partition == "auto"
    sample_input = sample_input_of(data, config.pipeline.num_microbatches) if auto else None
    scaler = DynamicLossScaler(enabled=config.train.precision == "fp16")
    if pool:  # the pool steps its own host optimizer (fp32 masters and state in host memory, CPU kernels)
        pipeline = pool_pipeline(config, piped, loss, sample_input, scaler if scaler.enabled else None,
                                 data_parallel_group=replicas)
        optimizer = pipeline.optimizer
    else:
        pipeline = stage_pipeline(config, piped, loss, sample_input, rank=rank, schedule=resumed_schedule(config))
        optimizer = build_optimizer(pipeline.parameters(), config.optimizer)
    steps = config.train.steps
    schedule = warmup_cosine(
        warmup_steps=config.optimizer.warmup_steps,
        total_steps=steps,
        min_lr_ratio=config.optimizer.min_lr_ratio,
    )
    trainer = Trainer(
        pipeline=pipeline, layers=piped.layers, loss=loss, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(getattr(optimizer, "torch_optimizer", optimizer), schedule),
        num_microbatches=config.pipeline.num_microbatches, grad_accum=config.train.grad_accum,
        max_grad_norm=config.optimizer.max_grad_norm, precision=config.train.precision, group=pipeline.group,
        autocast_device=pipeline.devices[0].type if pool else None, scaler=scaler,
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
    try:
        # stretches between evaluations and saves (the pool overlaps the steps of one)
        while trainer.step < steps:
            for stats in trainer.train_steps(data, _stretch(trainer.step, steps, config, evaluation), stop=stop):
                if trainer.step == first + 1:
                    steady_timeouts(config)
                losses.append(stats.loss)
                due = evaluation is not None and evaluation.due(trainer.step, steps)
                eval_loss = evaluation.run(trainer) if due else None
                if bar is not None and eval_loss is not None:
                    bar.write(f"step {trainer.step}: eval loss {eval_loss:.4f}")
                if metrics is not None:
                    metrics.log_stats(stats, eval_loss=eval_loss)
                if warm or trainer.step == steps:  # the first step pays one-off setup; keep it out of tokens/s
                    # (stats.tokens counts non-padding tokens only: padding never inflates tokens/s)
                    tokens, seconds = tokens + stats.tokens, seconds + stats.seconds
                warm = True
                if bar is not None and (trainer.step % config.train.log_every == 0 or trainer.step == steps):
                    bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{tokens / max(seconds, 1e-9):,.0f}")
                if bar is not None:
                    bar.update(1)
                every = config.train.save_every
                if every and trainer.step % every == 0 and trainer.step < steps:
                    trainer.save(os.path.join(out, f"checkpoint-{trainer.step}"),
                                 keep=config.train.keep_checkpoints)
                if stats.stop_signal is not None:  # the same on every rank: all stop after this step
                    _stopped(config, trainer, stats.stop_signal, bar)
    except BaseException:
        if bar is not None:  # end the bar's line: the error's message (cli.main) starts a line of its own
            bar.close()
        raise
    if bar is not None:
        bar.close()
    if metrics is not None:
        metrics.close()
    trainer.synchronize()  # the last update applied: the checkpoint, adapter and saved model hold it
    checkpoint = None
    if config.train.checkpoint or config.train.save_every:
        checkpoint = trainer.save(os.path.join(out, f"checkpoint-{trainer.step}"), keep=config.train.keep_checkpoints)
    writes = not pool or rank == 0  # a pool is one rank; its replicas hold the same weights
    adapter = _save_adapter(config, piped.model, pipeline) if writes else None
    saved_model = save_trained_model(config, piped.model, pipeline) if writes else None  # train.save_model
    if replicas is not None:  # tokens/s of the whole run: every replica's tokens over the same seconds
        tokens = _summed(tokens, replicas)
    result = finish(rank, pipeline, losses, tokens / max(seconds, 1e-9), out, checkpoint, adapter, trainer.step)
    if replicas is not None:
        import dataclasses

        import torch.distributed as dist

        result = dataclasses.replace(result, replicas=dist.get_world_size(replicas))
    if rank == 0:
        print(report(result, config))
        if saved_model is not None:
            print(f"model dir     {saved_model}  (AutoModelForCausalLM.from_pretrained loads it)")
    if pool and rank == 0 and pipeline.profile is not None:
        print(pool_partition_effect(pipeline))
    elif rank == 0 and pipeline.profile is not None:
        from .auto_partition import predicted_effect

        print(predicted_effect(pipeline.schedule, pipeline.profile, pipeline.partition,
                               baseline=pipeline.schedule_before_profile))
    return result


def _pool_replicas():
    """The default group when torch.distributed joins this pool to others (``run_pool`` under torchrun), else
    None: one pool alone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def _summed(count: int, group) -> int:
    import torch
    import torch.distributed as dist

    total = torch.tensor([count], dtype=torch.int64)
    dist.all_reduce(total, group=group)
    return int(total)


def _stretch(step: int, steps: int, config: RunConfig, evaluation) -> int:
    """Optimizer steps from ``step`` to the next one the run evaluates or saves after, or to its end: one
    ``Trainer.train_steps`` call, whose steps the pool overlaps (the pool is idle again when it ends)."""
    ends = [steps]
    for every in (config.train.save_every, 0 if evaluation is None else evaluation.every):
        if every and every > 0:
            ends.append((step // every + 1) * every)
    return min(ends) - step


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
