"""Batches of a user's dataset: deterministic from a seed, ``batch(i)`` a pure function of ``i``.

Rows (a packed row of several documents, or one document when padding) are fixed once. Epoch ``e``
visits them in the order ``randperm(rows, seed, e)``; batch ``i`` is the ``i % per_epoch``-th slice of
epoch ``i // per_epoch`` (the incomplete last slice of an epoch is skipped). So, like the synthetic
task, a run resumed at data position ``i`` sees exactly the batches an uninterrupted run would, and
the checkpoint needs nothing but that position.

``batch(i)`` returns ``((input_ids, segments), labels)``: what ``Pipeline.step`` takes, the segments
travelling with the tokens into the first stage and on with the activations (``models/layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data_packing import fill, padded_length
from .data_tokenize import IGNORE_INDEX, Sample


@dataclass(frozen=True, kw_only=True)
class TokenBatches:
    """``batch(i)`` -> ((input_ids, segments), labels), each ``(batch_size, length)`` int64."""

    rows: list[list[Sample]]
    """The rows: lists of the documents each holds (one when not packing)."""
    batch_size: int
    """Rows per batch."""
    seq_len: int
    """Packed rows are this long; padded rows the batch's longest rounded up to ``multiple``, at most this."""
    packing: bool
    """Rows are packed (always ``seq_len`` tokens) rather than padded per batch."""
    pad_id: int
    """Token id of the padding (its labels are -100 and its segment 0, so its value never matters)."""
    seed: int = 0
    """Seed of the visiting order."""
    multiple: int = 16
    """Padded batches round their length up to this many tokens."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be at least 1, got {self.batch_size}")
        if len(self.rows) < self.batch_size:
            kind = "packed rows" if self.packing else "samples"
            raise ValueError(
                f"the data gives {len(self.rows)} {kind}, fewer than data.batch_size {self.batch_size}; "
                "add data or lower data.batch_size (and pipeline.num_microbatches with it)"
            )

    @property
    def batches_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.rows), generator=generator).tolist()

    def batch(self, index: int):
        epoch, k = divmod(index, self.batches_per_epoch)
        chosen = self.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]
        return self._tensors([self.rows[r] for r in chosen])

    def in_order(self):
        """Every full batch once, rows in their stored order (evaluation)."""
        for start in range(0, self.batches_per_epoch * self.batch_size, self.batch_size):
            yield self._tensors(self.rows[start:start + self.batch_size])

    def _tensors(self, rows):
        length = self.seq_len if self.packing else padded_length(rows, multiple=self.multiple, max_len=self.seq_len)
        ids, segments, labels = fill(rows, length, pad_id=self.pad_id)
        return (ids, segments), labels

    def tokens(self) -> int:
        """Tokens (not padding) in all rows."""
        return sum(len(s.input_ids) for row in self.rows for s in row)

    def trained_tokens(self) -> int:
        """Tokens that carry a label, over all rows."""
        return sum(sum(1 for v in s.labels if v != IGNORE_INDEX) for row in self.rows for s in row)
