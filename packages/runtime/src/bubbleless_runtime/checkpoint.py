"""Trainer checkpoints: one file per rank (``rank<global rank>.pt``) with everything that rank owns.

A checkpoint records the stage sizes its run was cut into. ``partition: auto`` profiles on every
start, and a resumed run whose profile cuts elsewhere would hold other layers than the ones saved on
its rank: parameter counts and shapes often still match (identical decoder layers), so without the
record it would silently load one layer's weights into another. ``restore`` refuses instead and says
which cut to pin. A stage-bound cut is recorded as its list of stage sizes, a round-robin pool's as
``{"forward": [...], "last": n, "backward": [...]}``: the form ``pipeline.partition`` takes, so the
message can be pasted into the config.

The round-robin pool runs in one process and its whole host state (the fp32 parameters the optimizer
steps, the optimizer's state) is this one rank's, so its checkpoint is one ``rank00000.pt``.
"""

from __future__ import annotations

import os
import random

import torch

from bubbleless_schedules.roundrobin_layout import PoolGroups

from .collectives import barrier, global_rank


def capture(trainer) -> dict:
    """The trainer's resumable state on this rank."""
    return {
        "params": [p.detach().cpu().clone() for p in trainer.params],
        "partition": partition_record(getattr(trainer.pipeline, "partition", None)),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "step": trainer.step,
        "data_position": trainer.data_position,
    }


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
    with torch.no_grad():
        for p, saved in zip(trainer.params, state["params"], strict=True):
            p.copy_(saved)
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    trainer.step, trainer.data_position = state["step"], state["data_position"]


def _path(directory: str | os.PathLike) -> str:
    return os.path.join(directory, f"rank{global_rank():05d}.pt")


def save(state: dict, directory: str | os.PathLike, group) -> str:
    """Write this rank's ``state`` under ``directory`` and wait for every rank of ``group`` (call on all)."""
    os.makedirs(directory, exist_ok=True)
    torch.save(state, _path(directory))
    barrier(group)
    return str(directory)


def load(directory: str | os.PathLike) -> dict:
    """This rank's state from ``directory``; ValueError when the checkpoint has no file for this rank."""
    path = _path(directory)
    if not os.path.isfile(path):
        raise ValueError(f"no checkpoint for this rank at {path}; resume with the rank count that saved it")
    return torch.load(path, weights_only=False)
