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


class DynamicLossScaler:
    """fp16 loss scaling: halve on overflow (step skipped on all ranks), double after a run of good steps."""

    def __init__(self, *, initial_scale: float = 2.0**16, growth_interval: int = 200, enabled: bool = True):
        self.scale = initial_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.enabled = enabled
        self.good_steps = 0

    def unscale_and_check(self, params: Sequence[nn.Parameter], group) -> bool:
        """Divide grads by the scale; True if any rank found inf/nan (then the step must be skipped)."""
        if not self.enabled:
            return False
        overflow = torch.zeros(())
        for p in params:
            if p.grad is not None:
                p.grad.mul_(1.0 / self.scale)
                if not torch.isfinite(p.grad).all():
                    overflow.fill_(1.0)
        all_reduce(overflow, dist.ReduceOp.MAX, group)
        found = bool(overflow.item())
        if found:
            self.scale /= 2.0
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale *= 2.0
                self.good_steps = 0
        return found

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = state["scale"], state["good_steps"]
