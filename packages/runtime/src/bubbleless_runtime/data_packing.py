"""Tokenized samples -> fixed-length rows: packed with per-document attention, or right-padded.

Both produce ``(input_ids, segments, labels)`` rows. ``segments`` numbers the documents of a row from 1
and marks padding with 0; the decoder layers (``models/layers.py``) derive from it the per-document
causal mask (a token attends to earlier tokens of its own document only) and the position ids, which
restart at 0 with every document. In a padded row ``segments`` is exactly Hugging Face's
``attention_mask`` (1 for tokens, 0 for padding).

- ``pack``: documents are laid end to end into rows of ``seq_len`` tokens in the order given (next fit:
  a document that does not fit the current row starts the next one; documents are never split), the
  rest of a row padded.
- padding: one document per row, right-padded to the longest of the batch (``padded_length``: rounded
  up to a multiple, so the pipeline sees few distinct shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data_tokenize import IGNORE_INDEX, Sample

TRUNCATIONS = ("truncate", "drop")


@dataclass(frozen=True)
class Fitted:
    """Samples cut to ``seq_len``, and how many needed it."""

    samples: list[Sample]
    truncated: int
    """Samples longer than ``seq_len`` that were cut to it."""
    dropped: int
    """Samples left out: longer than ``seq_len`` with ``truncation: drop``, or with no trained token left
    after truncation."""
    tokens_cut: int = 0
    """Tokens the truncated samples lost and the dropped ones held."""
    tokens_in: int = 0
    """Tokens of every sample before fitting."""


def fit_length(samples: list[Sample], seq_len: int, truncation: str) -> Fitted:
    """Every sample at most ``seq_len`` tokens: truncated or dropped, as ``truncation`` says."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation {truncation!r} is unknown; choose one of {list(TRUNCATIONS)}")
    if seq_len < 2:
        raise ValueError(f"data.seq_len must be at least 2, got {seq_len}")
    kept, truncated, dropped, cut_tokens = [], 0, 0, 0
    for sample in samples:
        n = len(sample.input_ids)
        if n <= seq_len:
            kept.append(sample)
            continue
        if truncation == "drop":
            dropped, cut_tokens = dropped + 1, cut_tokens + n
            continue
        cut = Sample(sample.input_ids[:seq_len], sample.labels[:seq_len], sample.source)
        if all(v == IGNORE_INDEX for v in cut.labels):
            dropped, cut_tokens = dropped + 1, cut_tokens + n  # the trained part lies past seq_len
            continue
        truncated, cut_tokens = truncated + 1, cut_tokens + n - seq_len
        kept.append(cut)
    return Fitted(kept, truncated, dropped, cut_tokens, sum(len(s.input_ids) for s in samples))


def pack(samples: list[Sample], seq_len: int) -> list[list[Sample]]:
    """``samples`` (each at most ``seq_len`` tokens) laid end to end into rows of at most ``seq_len``
    tokens, in order (next fit); ``fill`` turns rows into tensors."""
    rows: list[list[Sample]] = []
    used = seq_len + 1  # forces a new row for the first sample
    for sample in samples:
        n = len(sample.input_ids)
        if n > seq_len:
            raise ValueError(f"{sample.source}: sample of {n} tokens is longer than data.seq_len {seq_len}")
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(sample)
        used += n
    return rows


def padded_length(rows: list[list[Sample]], *, multiple: int = 16, max_len: int | None = None) -> int:
    """The longest row's tokens rounded up to ``multiple`` (never past ``max_len`` unless a row is)."""
    longest = max(sum(len(s.input_ids) for s in row) for row in rows)
    length = -(-longest // multiple) * multiple
    return length if max_len is None else max(longest, min(length, max_len))


def fill(rows: list[list[Sample]], length: int, *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of documents as (input_ids, segments, labels), each ``(len(rows), length)`` int64, right-padded."""
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    segments = torch.zeros((len(rows), length), dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for document, sample in enumerate(row, start=1):
            n = len(sample.input_ids)
            ids[r, at:at + n] = torch.tensor(sample.input_ids)
            labels[r, at:at + n] = torch.tensor(sample.labels)
            segments[r, at:at + n] = document
            at += n
    return ids, segments, labels
