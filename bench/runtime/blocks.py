"""The model the runtime benchmarks pipeline: pre-norm MLP blocks, the linear-heavy shape of a
transformer layer (so the backward split's deferred weight gradients carry most of W)."""

from __future__ import annotations

from torch import nn


class Block(nn.Module):
    """x + down(gelu(up(norm(x)))), with a 4x wide hidden layer."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))
