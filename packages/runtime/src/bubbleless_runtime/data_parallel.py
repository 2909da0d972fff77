"""Gradient averaging across pipeline replicas (data parallelism), done explicitly.

DDP's hooks fire when autograd accumulates a gradient, which a split backward never does for the
deferred weights; so each stage's gradients are reduced by hand as soon as the stage's last W (or B)
of the step has run. The all-reduce is launched asynchronously there, overlapping the rest of the
schedule, and waited at the end of the step. Gradients are averaged (as DDP does), so a replica count
change does not rescale the learning rate.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .comm import wait_collective


class GradientAverager:
    """Averages the gradients of one stage's parameters over ``group`` (launched per stage, waited once)."""

    def __init__(self, group, modules: dict, *, timeout: float, rank: int) -> None:
        self.group, self.modules, self.timeout, self.rank = group, modules, timeout, rank
        self.size = dist.get_world_size(group)
        self.pending: list = []

    def stage_done(self, stage: int) -> None:
        params = [p for p in self.modules[stage].parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # replicas must reduce the same tensors; an unused parameter reduces zeros
                p.grad = torch.zeros_like(p)
        by_dtype: dict = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = _flatten_dense_tensors(grads)
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.pending.append((stage, work, flat, grads))

    def finish(self) -> None:
        pending, self.pending = self.pending, []
        for stage, work, flat, grads in pending:
            wait_collective(work, self.timeout, f"data-parallel gradient all-reduce of stage {stage}", self.rank)
            flat.div_(self.size)
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(reduced)
