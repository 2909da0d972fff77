"""``DynamicLossScaler``: fp16 loss scaling with overflow detection, for one process.

fp16 gradients underflow unless the loss is multiplied by a large factor before backward; the factor
must shrink when gradients overflow (inf/nan: that step is skipped) and may grow again after a run of
good steps. Split into ``unscale_`` (local: divide and look for inf/nan) and ``update`` (decide the next
scale) so that a multi-rank user can agree on the overflow flag between the two (the runtime's scaler
all-reduces it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["DynamicLossScaler"]


class DynamicLossScaler:
    """Halve the scale on overflow (and skip the step), double it after ``growth_interval`` good steps.

    ``enabled=False`` (fp32/bf16 training) keeps the scale at 1 and never reports an overflow.
    """

    def __init__(self, *, initial_scale: float = 2.0**16, growth_interval: int = 200, enabled: bool = True) -> None:
        if not (math.isfinite(initial_scale) and initial_scale > 0):
            raise ValueError(f"initial_scale must be a finite number > 0, got {initial_scale}")
        if growth_interval < 1:
            raise ValueError(f"growth_interval must be at least 1 step, got {growth_interval}")
        self.scale = initial_scale if enabled else 1.0
        """The factor the loss is multiplied by now."""
        self.growth_interval = growth_interval
        self.enabled = enabled
        self.good_steps = 0
        """Steps without overflow since the scale last changed."""

    def unscale_(self, tensors: Iterable[torch.Tensor | None]) -> bool:
        """Divide gradient tensors by the scale in place; True if any holds inf/nan (None entries skipped)."""
        if not self.enabled:
            return False
        inverse = 1.0 / self.scale
        finite: dict[torch.device, list[torch.Tensor]] = {}
        for tensor in tensors:
            if tensor is not None:
                tensor.mul_(inverse)
                finite.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
        # one host synchronisation per device, not one per tensor
        return not all(bool(torch.stack(flags).all()) for flags in finite.values())

    def update(self, found_overflow: bool) -> None:
        """Move the scale after a step: halve on overflow (and restart the count), else count a good step."""
        if not self.enabled:
            return
        if found_overflow:
            self.scale /= 2.0
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale *= 2.0
                self.good_steps = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = state["scale"], state["good_steps"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale={self.scale}, good_steps={self.good_steps}, enabled={self.enabled})"
