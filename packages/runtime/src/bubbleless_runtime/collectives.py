"""The Trainer's collectives, which are no-ops in a single process (one rank, no process group), and over
``THIS_PROCESS``, the group of a pipeline that is one process (the round-robin pool), even where
torch.distributed is initialised for its data-parallel replicas."""

from __future__ import annotations

import torch
import torch.distributed as dist


class _ThisProcess:
    def __repr__(self) -> str:
        return "THIS_PROCESS"


THIS_PROCESS = _ThisProcess()
"""The process group of a pipeline held by this process alone (``RoundRobinPipeline.group``): its
collectives do nothing and it is rank 0 of it, whatever torch.distributed joins it to (its replicas)."""


def is_distributed(group=None) -> bool:
    """Whether collectives over ``group`` (None: the default group) have other processes to reach."""
    return group is not THIS_PROCESS and dist.is_available() and dist.is_initialized()


def global_rank(group=None) -> int:
    """This process's rank among the writers of ``group``'s files: its global rank, 0 for ``THIS_PROCESS``."""
    return dist.get_rank() if is_distributed(group) else 0


def backend_device(group=None) -> torch.device:
    """Where a collective's tensors must live: NCCL (and RCCL, which reports itself as NCCL) takes only
    tensors on the current GPU; gloo takes CPU tensors."""
    if is_distributed(group) and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op, group) -> None:
    """In-place all-reduce of ``tensor`` wherever it lives (moved to the backend's device and back)."""
    if is_distributed(group):
        device = backend_device(group)
        if tensor.device == device:
            dist.all_reduce(tensor, op=op, group=group)
        else:
            moved = tensor.to(device)
            dist.all_reduce(moved, op=op, group=group)
            tensor.copy_(moved)


def barrier(group) -> None:
    if is_distributed(group):
        dist.barrier(group=group)
