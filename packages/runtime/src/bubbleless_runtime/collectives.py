"""The Trainer's collectives, which are no-ops in a single process (one rank, no process group)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def all_reduce(tensor: torch.Tensor, op, group) -> None:
    if is_distributed():
        dist.all_reduce(tensor, op=op, group=group)


def barrier(group) -> None:
    if is_distributed():
        dist.barrier(group=group)
