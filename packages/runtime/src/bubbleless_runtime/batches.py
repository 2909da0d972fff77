"""A step's batch: checked on every rank before any communication, then cut into micro-batches.

Everything here is local to a rank, so a bad batch raises the same ``ValueError`` on every rank that
was given it, before the first transfer, instead of failing on one rank while the others wait.
"""

from __future__ import annotations

import torch


def _tensors_of(batch, what: str) -> tuple:
    tensors = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in tensors):
        raise ValueError(f"{what} must be a Tensor or a tuple of Tensors with a batch dimension first")
    return tensors


def check_batch(inputs, targets, num_microbatches: int) -> None:
    """Every input and target tensor has the same batch size (dim 0), which the micro-batches divide.

    Checked on every rank before any communication: a mismatch found later (the targets meet the outputs
    in the loss, on the last rank only) would fail there while the other ranks wait for it."""
    named = [(f"inputs[{i}]", t) for i, t in enumerate(_tensors_of(inputs, "inputs"))]
    named += [(f"targets[{i}]", t) for i, t in enumerate(_tensors_of(targets, "targets"))]
    sizes = {name: t.shape[0] for name, t in named}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} {size}" for name, size in sizes.items())
        raise ValueError(
            f"inputs and targets must have the same batch size (dim 0), got {listed}; "
            "pass one target row per input row"
        )
    size = next(iter(sizes.values()))
    if size % num_microbatches:
        raise ValueError(
            f"batch size {size} is not divisible by {num_microbatches} micro-batches; "
            f"use a batch size that is a multiple of {num_microbatches} or change num_microbatches"
        )


def split_batch(batch, num_microbatches: int, device) -> list:
    """``batch`` (a Tensor or a tuple/list of Tensors, checked by ``check_batch``) cut into equal
    micro-batches along dim 0."""
    tensors = batch if isinstance(batch, (tuple, list)) else (batch,)
    chunks = [t.to(device).chunk(num_microbatches) for t in tensors]
    if isinstance(batch, (tuple, list)):
        return [tuple(c[m] for c in chunks) for m in range(num_microbatches)]
    return list(chunks[0])


def signature_of(microbatch) -> tuple:
    tensors = microbatch if isinstance(microbatch, tuple) else (microbatch,)
    return tuple((tuple(t.shape), str(t.dtype)) for t in tensors)
