"""A synthetic sequence task generated in code, so the default run needs no dataset and its loss drops.

Each sample is ``BOS x SEP f(x)`` with ``x`` a random symbol string and ``f`` copy, reverse or sort;
the labels mask everything up to SEP, so the loss measures only how well the model computes ``f(x)``.
Batch ``i`` is a pure function of (seed, i): a run resumed at data position ``i`` sees exactly the
batches an uninterrupted run would, with no sampler state to save.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .models.loss import IGNORE_INDEX

PAD, BOS, SEP = 0, 1, 2
FIRST_SYMBOL = 3

TASKS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "copy": lambda x: x,
    "reverse": lambda x: x.flip(-1),
    "sort": lambda x: x.sort(dim=-1).values,
}


@dataclass(frozen=True, kw_only=True)
class SyntheticTask:
    """``batch(i)`` -> (input_ids, labels), both ``(batch_size, 2 * length + 2)`` int64."""

    task: str = "sort"
    """Key of ``TASKS``."""
    num_symbols: int = 16
    """Distinct symbols; token ids FIRST_SYMBOL .. FIRST_SYMBOL + num_symbols - 1."""
    length: int = 12
    """Symbols per input string."""
    batch_size: int = 32
    """Samples per batch."""
    seed: int = 0
    """Seed of the whole stream."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {sorted(TASKS)}")

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.num_symbols

    @property
    def sequence_length(self) -> int:
        return 2 * self.length + 2

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        symbols = torch.randint(
            FIRST_SYMBOL, self.vocab_size, (self.batch_size, self.length), generator=generator
        )
        bos = torch.full((self.batch_size, 1), BOS, dtype=torch.long)
        sep = torch.full((self.batch_size, 1), SEP, dtype=torch.long)
        ids = torch.cat([bos, symbols, sep, TASKS[self.task](symbols)], dim=1)
        labels = ids.clone()
        labels[:, : self.length + 2] = IGNORE_INDEX
        return ids, labels

    def tokens_per_batch(self) -> int:
        return self.batch_size * self.sequence_length
