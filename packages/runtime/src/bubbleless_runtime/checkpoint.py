"""Trainer checkpoints: per rank, ``rank<global rank>.safetensors`` (tensors) and ``.json`` (the rest)
with everything that rank owns, plus a ``manifest.json``; written atomically and loaded without
unpickling (``checkpoint_files``, ``checkpoint_state``).

A checkpoint records the stage sizes its run was cut into. ``partition: auto`` profiles on every
start, and a resumed run whose profile cuts elsewhere would hold other layers than the ones saved on
its rank: parameter counts and shapes often still match (identical decoder layers), so without the
record it would silently load one layer's weights into another. ``restore`` refuses instead and says
which cut to pin. A stage-bound cut is recorded as its list of stage sizes, a round-robin pool's as
``{"forward": [...], "last": n, "backward": [...]}``: the form ``pipeline.partition`` takes, so the
message can be pasted into the config.

The round-robin pool runs in one process and its whole host state (the fp32 parameters the optimizer
steps, the optimizer's state) is this one rank's, so its checkpoint is one ``rank00000`` pair. With the
pool's host optimizer it also holds ``masters``, the store's fp32 masters (``master_state_dict``: separate
tensors from the working weights when those are bf16 or the optimizer is one step stale), and
``optimizer`` is the host optimizer's ``state_dict``; both are taken after ``Trainer.synchronize`` has
applied an update in flight, and a resume restores them, so it continues bit-identically to the run that
saved them.

``rng`` holds the generators' states, CUDA's among them where CUDA is available (``checkpoint_rng``).

Optimizer hyperparameters follow the run, not the checkpoint: loading an optimizer's and a scheduler's
state would bring back the saved ``lr`` (the scheduler's ``base_lrs``, each group's ``initial_lr`` and
``lr``), ``weight_decay``, ``betas``, ``eps`` and ``momentum``, silently undoing a config changed to resume
with another learning rate. ``restore`` notes those of the optimizer as built (from the config) first, and
where the loaded ones differ puts them back, the lr scaled by the schedule at the resumed step, and says so
in one line (rank 0). The same config resumes untouched, so bit-identically. The pool's host optimizer
steps with its ``torch_optimizer``'s groups (the one-step-stale one copies them at every hand-off), so the
same applies there.
"""

from __future__ import annotations

import os
import shutil

import torch
import torch.distributed as dist

from bubbleless_offload import HostStepResult
from bubbleless_schedules.roundrobin_layout import PoolGroups

from . import checkpoint_files as files
from . import checkpoint_state
from .checkpoint_rng import capture_rng, restore_rng
from .collectives import barrier, global_rank, is_distributed


def capture(trainer) -> dict:
    """The trainer's resumable state on this rank (an update in flight applied first)."""
    trainer.synchronize()
    return {
        "params": [p.detach().cpu().clone() for p in trainer.params],
        "masters": _masters(trainer),
        "partition": partition_record(getattr(trainer.pipeline, "partition", None)),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": capture_rng(),
        "step": trainer.step,
        "data_position": trainer.data_position,
        "drained": None if trainer.drained is None else [trainer.drained.grad_norm, trainer.drained.skipped],
    }


def _masters(trainer) -> list[torch.Tensor] | None:
    """The pool's fp32 masters in store order (None: a torch optimizer over the parameters themselves)."""
    if not trainer.host:
        return None
    return [m.detach().clone() for m in trainer.pipeline.store.master_state_dict().values()]


def _check_optimizer_kind(trainer, state: dict) -> None:
    saved_host = state.get("masters") is not None
    if saved_host != trainer.host:
        kinds = {True: "the round-robin pool's host optimizer", False: "a torch optimizer over .grad"}
        raise ValueError(
            f"checkpoint was written with {kinds[saved_host]} but this run steps {kinds[trainer.host]}; its "
            "optimizer state cannot load here: resume with the bubbleless version and schedule that wrote it"
        )


def partition_record(partition) -> list[int] | dict | None:
    """A pipeline's cut as a checkpoint keeps it: stage sizes as a list, a round-robin ``PoolGroups`` as
    ``{"forward": [...], "last": n, "backward": [...]}`` (None: not cut)."""
    if partition is None or isinstance(partition, dict):
        return partition
    if isinstance(partition, PoolGroups):
        return {"forward": list(partition.forward), "last": partition.last, "backward": list(partition.backward)}
    return list(partition)


def cut_text(record) -> str:
    """A recorded cut as ``pipeline.partition`` is written in YAML (a round-robin one in flow style)."""
    if isinstance(record, dict):
        return f"{{forward: {list(record['forward'])}, last: {record['last']}, backward: {list(record['backward'])}}}"
    return str(list(record))


def check_partition(saved, current) -> None:
    """ValueError when the checkpoint's cut differs from this run's (either unknown: no check)."""
    saved, current = partition_record(saved), partition_record(current)
    if saved is None or current is None or saved == current:
        return
    raise ValueError(
        f"checkpoint was cut {cut_text(saved)} but this run cut {cut_text(current)}; "
        f"set pipeline.partition: {cut_text(saved)} to resume"
    )


def restore(trainer, state: dict) -> None:
    """Load ``capture``'s state into ``trainer`` (checked before anything is changed)."""
    check_partition(state.get("partition"), getattr(trainer.pipeline, "partition", None))
    if len(state["params"]) != len(trainer.params):
        raise ValueError(
            f"checkpoint holds {len(state['params'])} parameters for this rank but it trains "
            f"{len(trainer.params)}; resume with the same model, schedule, partition and rank count"
        )
    for p, saved in zip(trainer.params, state["params"], strict=True):
        if p.shape != saved.shape:
            raise ValueError(f"checkpoint parameter shape {tuple(saved.shape)} != {tuple(p.shape)}")
    _check_optimizer_kind(trainer, state)
    trainer.synchronize()
    configured = _hyperparameters(trainer)
    with torch.no_grad():
        for p, saved in zip(trainer.params, state["params"], strict=True):
            p.copy_(saved)
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.host:
        store = trainer.pipeline.store
        store.load_master_state_dict(dict(zip(store.master_state_dict(), state["masters"], strict=True)))
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    changed = _apply_hyperparameters(trainer, configured)
    if changed and (not dist.is_initialized() or dist.get_rank() == 0):  # data-parallel pools: replica 0 alone
        print(f"resume: the config's optimizer settings replace the checkpoint's: {'; '.join(changed)}")
    trainer.scaler.load_state_dict(state["scaler"])
    restore_rng(state["rng"])
    trainer.step, trainer.data_position = state["step"], state["data_position"]
    drained = state.get("drained")
    trainer.drained = None if drained is None else HostStepResult(grad_norm=drained[0], skipped=drained[1])


_HYPERPARAMETERS = ("weight_decay", "betas", "eps", "momentum")  # of the config's optimizer.*; lr: below


def _torch_optimizer(trainer) -> torch.optim.Optimizer:
    return getattr(trainer.optimizer, "torch_optimizer", trainer.optimizer)  # the pool's host optimizer's


def _hyperparameters(trainer) -> list[dict]:
    """Per parameter group, the optimizer's base lr (before the schedule's factor) and ``_HYPERPARAMETERS``."""
    groups = _torch_optimizer(trainer).param_groups
    bases = trainer.scheduler.base_lrs if trainer.scheduler is not None else [g["lr"] for g in groups]
    return [{"lr": base, **{k: g[k] for k in _HYPERPARAMETERS if k in g}} for base, g in zip(bases, groups, strict=True)]


def _apply_hyperparameters(trainer, configured: list[dict]) -> list[str]:
    """Put back the ``configured`` hyperparameters where the loaded ones differ; what changed, as text."""
    loaded = _hyperparameters(trainer)
    if loaded == configured:
        return []
    groups, scheduler = _torch_optimizer(trainer).param_groups, trainer.scheduler
    changed = []
    for index, (group, want, had) in enumerate(zip(groups, configured, loaded, strict=True)):
        for key in want:
            note = f"{key} {_number(had.get(key))} -> {_number(want[key])}"
            if want[key] != had.get(key) and note not in changed:  # one note for groups that changed alike
                changed.append(note)
        group.update({k: v for k, v in want.items() if k != "lr"})
        if want["lr"] != had["lr"]:
            if scheduler is None:
                group["lr"] = want["lr"]
            else:
                scheduler.base_lrs[index] = want["lr"]
                group["initial_lr"] = want["lr"]
                group["lr"] = _scheduled_lr(scheduler, index, want["lr"], group["lr"], had["lr"])
    if scheduler is not None:
        scheduler._last_lr = [g["lr"] for g in groups]  # what get_last_lr() reports
    return changed


def _scheduled_lr(scheduler, index: int, base: float, current: float, old_base: float) -> float:
    """The lr of group ``index`` at the scheduler's step with base lr ``base``: a ``LambdaLR``'s factor
    there, another scheduler's current lr scaled by the change of base."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR) and lambdas:
        return base * lambdas[index](scheduler.last_epoch)
    return current * base / old_base if old_base else base


def _number(value) -> str:
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_number(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _name(rank: int) -> str:
    return f"rank{rank:05d}"


def _world(group) -> int:
    return dist.get_world_size(group) if is_distributed(group) else 1


def save(state: dict, directory: str | os.PathLike, group, *, schedule=None, keep: int = 0) -> str:
    """Write this rank's ``state`` into checkpoint ``directory`` (call on every rank of ``group``).

    Atomic (``checkpoint_files``): the directory appears complete, with its manifest, or not at all.
    ``schedule``: the ``Schedule`` the run executes, kept in the manifest so a resumed run can execute
    the very same one. ``keep``: afterwards keep only the newest this many complete checkpoints of the
    parent directory (0: all). Returns ``directory``."""
    directory = os.path.abspath(os.fspath(directory))
    partial = files.partial_path(directory)
    rank, world = global_rank(group), _world(group)
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a write that was killed
        os.makedirs(partial)
    barrier(group)
    name = _name(rank)
    checkpoint_state.write(state, os.path.join(partial, name + ".safetensors"), os.path.join(partial, name + ".json"))
    mine = {n: files.file_record(os.path.join(partial, n)) for n in (name + ".safetensors", name + ".json")}
    records = _gather(mine, group, world)
    if rank == 0:
        manifest = {
            "step": state["step"], "world_size": world, "files": {k: v for r in records for k, v in r.items()},
            "partition": state.get("partition"),
            "schedule": None if schedule is None else {"name": schedule.name, "text": schedule.to_text()},
        }
        files.publish(partial, directory, manifest, keep=keep)
    barrier(group)
    return directory


def _gather(mine: dict, group, world: int) -> list[dict]:
    if world == 1:
        return [mine]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    return everyone


def manifest_of(directory: str | os.PathLike) -> dict:
    """A complete checkpoint's manifest (ValueError when incomplete or foreign, see ``checkpoint_files``)."""
    return files.check_complete(os.fspath(directory))


def load(directory: str | os.PathLike, group=None) -> dict:
    """This rank's state from ``directory`` (``group``: the pipeline's, None the default); ValueError when
    the checkpoint is incomplete, corrupt, or was written by another number of ranks."""
    directory = os.fspath(directory)
    manifest = files.check_complete(directory)
    rank, world = global_rank(group), _world(group)
    saved = manifest.get("world_size")
    if saved != world:
        raise ValueError(
            f"checkpoint {directory} was written by {saved} ranks but this run has {world}: a rank's file holds "
            f"its own stages, so resume with {saved} ranks (pipeline.nproc: {saved}, or torchrun "
            f"--nproc-per-node {saved}) and the same schedule and partition"
        )
    name = _name(rank)
    tensors = files.verify_file(directory, name + ".safetensors", manifest)
    meta = files.verify_file(directory, name + ".json", manifest)
    return checkpoint_state.read(tensors, meta)
