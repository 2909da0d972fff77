"""The Trainer's collectives, which are no-ops in a single process (one rank, no process group)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def backend_device(group=None) -> torch.device:
    """Where a collective's tensors must live: NCCL (and RCCL, which reports itself as NCCL) takes only
    tensors on the current GPU; gloo takes CPU tensors."""
    if is_distributed() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(tensor: torch.Tensor, op, group) -> None:
    """In-place all-reduce of ``tensor`` wherever it lives (moved to the backend's device and back)."""
    if is_distributed():
        device = backend_device(group)
        if tensor.device == device:
            dist.all_reduce(tensor, op=op, group=group)
        else:
            moved = tensor.to(device)
            dist.all_reduce(moved, op=op, group=group)
            tensor.copy_(moved)


def barrier(group) -> None:
    if is_distributed():
        dist.barrier(group=group)
