"""A tiny ``Trainer`` for checkpoint tests: three layers, two micro-batches, AdamW, batches by position."""

from __future__ import annotations

import torch

from ..trainer import ScaledLoss, Trainer
from . import SequentialPipeline, tiny_batch, tiny_loss, tiny_model


class TinyBatches:
    """The batch at each position is fixed by its seed, so a resumed run sees the same data."""

    def batch(self, position: int):
        return tiny_batch(4, seed=position)


def tiny_trainer(seed: int = 0) -> Trainer:
    model = tiny_model(3, seed=seed)
    loss = ScaledLoss(tiny_loss)
    pipe = SequentialPipeline(list(model), loss, 2)
    optimizer = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=optimizer, num_microbatches=2)
