"""Trainer checkpoints: one file per rank (``rank<global rank>.pt``) with everything that rank owns.

A checkpoint records the stage sizes its run was cut into. ``partition: auto`` profiles on every
start, and a resumed run whose profile cuts elsewhere would hold other layers than the ones saved on
its rank: parameter counts and shapes often still match (identical decoder layers), so without the
record it would silently load one layer's weights into another. ``restore`` refuses instead and says
which cut to pin.
"""

from __future__ import annotations

import os
import random

import torch

from .collectives import barrier, global_rank


def capture(trainer) -> dict:
    """The trainer's resumable state on this rank."""
    partition = getattr(trainer.pipeline, "partition", None)
    return {
        "params": [p.detach().cpu().clone() for p in trainer.params],
        "partition": None if partition is None else list(partition),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "step": trainer.step,
        "data_position": trainer.data_position,
    }


def check_partition(saved, current) -> None:
    """ValueError when the checkpoint's stage sizes differ from this run's (either unknown: no check)."""
    if saved is None or current is None or list(saved) == list(current):
        return
    raise ValueError(
        f"checkpoint was cut {list(saved)} but this run cut {list(current)}; "
        f"set pipeline.partition: {list(saved)} to resume"
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
