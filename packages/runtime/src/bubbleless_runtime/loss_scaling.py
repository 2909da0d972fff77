"""Loss scaling for the Trainer: ``ScaledLoss`` (the pipeline's ``loss_fn``) and the fp16 ``DynamicLossScaler``.

The executor calls ``backward`` itself, so the only place to multiply the loss (by 1/micro-batches for
a mean, and by the fp16 loss scale) is the loss function. The fp16 scaler is our own, not
``torch.amp.GradScaler``, because overflow must be agreed on by all ranks (all-reduce) or they would
step different optimizers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from bubbleless_offload import DynamicLossScaler as CoreLossScaler

from .collectives import all_reduce


class ScaledLoss:
    """``loss_fn(output, target) * factor``; the Trainer sets ``factor`` before each pipeline step."""

    def __init__(self, loss_fn: Callable) -> None:
        if not callable(loss_fn):
            raise ValueError("loss_fn must be callable: loss_fn(output, target) -> scalar tensor")
        self.loss_fn = loss_fn
        self.factor = 1.0

    def __call__(self, output, target) -> torch.Tensor:
        return self.loss_fn(output, target) * self.factor

    def fused_head_backward(self, head, activation, target, *, scale: float = 1.0):
        """The wrapped loss's chunked head forward-and-backward (see ``CausalLMLoss``), scaled; None
        when the wrapped loss has none or does not take this head."""
        fused = getattr(self.loss_fn, "fused_head_backward", None)
        return None if fused is None else fused(head, activation, target, scale=scale * self.factor)


class DynamicLossScaler(CoreLossScaler):
    """fp16 loss scaling: halve on overflow (step skipped on all ranks), double after a run of good steps.

    The scale arithmetic is ``bubbleless_offload.DynamicLossScaler``'s; this class adds only the
    all-reduce that makes every rank see the same overflow flag.
    """

    def unscale_and_check(self, params: Sequence[nn.Parameter], group) -> bool:
        """Divide grads by the scale; True if any rank found inf/nan (then the step must be skipped)."""
        if not self.enabled:
            return False
        local = self.unscale_([p.grad for p in params])
        overflow = torch.full((), 1.0 if local else 0.0)
        all_reduce(overflow, dist.ReduceOp.MAX, group)
        found = bool(overflow.item())
        self.update(found)
        return found
