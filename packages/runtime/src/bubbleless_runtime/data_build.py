"""``data.path`` to training and validation batches: read, tokenize (cached), split, fit, pack or pad.

On several ranks, local rank 0 of each machine tokenizes and writes the cache while the others wait at
a barrier, then every rank reads the same cache: the ranks agree on every token without sending any.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .data_batches import TokenBatches
from .data_files import read_records
from .data_packing import fit_length, pack
from .data_tokenize import cache_key, load_samples, save_samples, tokenize_records


@dataclass(frozen=True)
class DataSplit:
    """What ``build_data`` made."""

    train: TokenBatches
    validation: TokenBatches | None
    summary: str
    """One paragraph for the run's report: samples, split, rows, truncated and dropped counts."""


def cache_directory(output_dir: str) -> str:
    """Where tokenized data is cached: ``.bubbleless-cache`` beside the output directory (so runs with
    different output directories share it)."""
    parent = os.path.dirname(os.path.abspath(output_dir))
    return os.path.join(parent, ".bubbleless-cache")


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    if not os.path.isdir(model_path):
        raise ValueError(f"model.path {model_path!r} is not a local directory; the tokenizer is read from it")
    return AutoTokenizer.from_pretrained(model_path, local_files_only=True)


def tokenized(path: str, tokenizer, *, format: str, train_on_prompt: bool, cache_root: str, progress: bool):
    """The samples of ``path`` from the cache, tokenizing and writing them first when absent; with the
    cache's directory and whether it was a hit."""
    directory = os.path.join(cache_root, cache_key(path, tokenizer, format=format, train_on_prompt=train_on_prompt))
    if os.path.isdir(directory):
        return load_samples(directory), directory, True
    found, records = read_records(path, format=format)
    samples = tokenize_records(records, found, tokenizer, train_on_prompt=train_on_prompt, progress=progress)
    save_samples(samples, directory)
    return samples, directory, False


def _tokenized_on_ranks(path, tokenizer, data, *, cache_root: str, rank: int):
    """``tokenized`` with local rank 0 of each machine writing and every other rank reading afterwards."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    options = dict(format=data.format, train_on_prompt=data.train_on_prompt, cache_root=cache_root)
    if not distributed:
        return tokenized(path, tokenizer, progress=rank == 0, **options)
    result, error = None, None
    if local_rank == 0:
        try:
            result = tokenized(path, tokenizer, progress=rank == 0, **options)
        except ValueError as caught:  # the others must still pass the barrier; they then find no cache
            error = caught
    dist.barrier()
    if error is not None:
        raise error
    return result if result is not None else tokenized(path, tokenizer, progress=False, **options)


def build_data(config, tokenizer, *, rank: int = 0) -> DataSplit:
    """The training batches (and validation batches, when asked for) of ``config.data``."""
    d = config.data
    cache_root = cache_directory(config.train.output_dir)
    samples, cache, hit = _tokenized_on_ranks(d.path, tokenizer, d, cache_root=cache_root, rank=rank)
    validation_samples = None
    if d.validation_path:
        validation_samples, _, _ = _tokenized_on_ranks(d.validation_path, tokenizer, d, cache_root=cache_root, rank=rank)
    elif d.validation_fraction:
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(d.seed)).tolist()
        count = max(1, round(d.validation_fraction * len(samples)))
        held = set(order[:count])
        validation_samples = [samples[i] for i in sorted(held)]
        samples = [s for i, s in enumerate(samples) if i not in held]
    pad_id = _pad_id(tokenizer)
    fitted = fit_length(samples, d.seq_len, d.truncation)
    train = _batches(fitted.samples, d, pad_id, shuffle_seed=d.seed)
    validation = None
    lines = [
        f"data: {len(samples)} training samples from {d.path} (tokenized cache {'reused' if hit else 'written'}: {cache})",
    ]
    if validation_samples is not None:
        held_fit = fit_length(validation_samples, d.seq_len, d.truncation)
        validation = _batches(held_fit.samples, d, pad_id, shuffle_seed=None, what="validation")
        lines.append(f"validation: {len(validation_samples)} samples, {validation.batches_per_epoch} batches "
                     f"({validation.tokens():,} tokens)")
    kind = f"packed into {len(train.rows)} rows of {d.seq_len} tokens" if d.packing else f"{len(train.rows)} rows, right-padded"
    fill = train.tokens() / (len(train.rows) * d.seq_len) if d.packing else None
    lines.append(
        f"train: {kind}{f' ({fill:.0%} filled)' if fill is not None else ''}, {train.batches_per_epoch} batches per "
        f"epoch, {train.trained_tokens():,} of {train.tokens():,} tokens trained; longer than seq_len {d.seq_len}: "
        f"{fitted.truncated} truncated, {fitted.dropped} dropped (data.truncation: {d.truncation})"
        + (f", {fitted.tokens_cut:,} of {fitted.tokens_in:,} tokens cut" if fitted.tokens_cut else "")
    )
    if fitted.tokens_cut * 2 > fitted.tokens_in:
        lines.append(f"warning: more than half the tokens ({fitted.tokens_cut:,} of {fitted.tokens_in:,}) are cut at "
                     f"data.seq_len {d.seq_len}: a .txt record is a paragraph (blank-line separated), a JSONL/JSON "
                     "record a sample; split long texts, or raise data.seq_len")
    return DataSplit(train, validation, "\n".join(lines))


def _batches(samples, d, pad_id: int, *, shuffle_seed: int | None, what: str = "training") -> TokenBatches:
    if not samples:
        fix = "raise data.seq_len" + (" or use truncation: truncate" if d.truncation != "truncate" else
                                      " (each sample's trained tokens lie past it)")
        raise ValueError(f"no {what} sample is left after fitting to data.seq_len {d.seq_len} "
                         f"(data.truncation: {d.truncation}); {fix}")
    if shuffle_seed is not None and d.packing:  # mix the documents that share a row
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(shuffle_seed + 1)).tolist()
        samples = [samples[i] for i in order]
    rows = pack(samples, d.seq_len) if d.packing else [[s] for s in samples]
    try:
        return TokenBatches(rows=rows, batch_size=d.batch_size, seq_len=d.seq_len, packing=d.packing,
                            pad_id=pad_id, seed=d.seed)
    except ValueError as error:
        raise ValueError(f"{what} data: {error}") from None


def _pad_id(tokenizer) -> int:
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return 0
