"""Records -> token ids and labels with the model's Hugging Face tokenizer, cached on disk.

Labels align with the input ids (the loss shifts them) and are ``-100`` where no loss is counted: the
prompt of a prompt/completion record and every non-assistant turn of a chat (unless
``train_on_prompt``), and always a sample's first token, which nothing before it predicts (in a packed
row the token before it belongs to another document; masking it keeps packed and padded losses equal).

Chats are rendered with the tokenizer's chat template as text; an assistant turn's characters are those
the template adds between the conversation up to that turn with the generation prompt and the
conversation including the turn; tokens starting inside those spans are trained. A template that does
not render conversations as prefixes of one another raises ``ValueError``.

The tokenized samples are written once, with the ``datasets`` library (Arrow files, memory-mapped when
read back), to a directory keyed by the data files' bytes, the tokenizer's vocabulary, special tokens
and chat template, and the options that change the result, so a second run starts at once and a
changed file or tokenizer is never served stale tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from .data_files import Record, data_files

IGNORE_INDEX = -100
CACHE_VERSION = 1
"""Bumped whenever tokenization changes what it produces, so old caches are not read."""


@dataclass(frozen=True)
class Sample:
    """One tokenized record."""

    input_ids: list[int]
    labels: list[int]
    source: str
    """Where the record came from (``file:line``)."""


def tokenize_record(record: Record, format: str, tokenizer, *, train_on_prompt: bool = False) -> Sample:
    """One record's ids and labels (see the module docstring)."""
    f = record.fields
    if format == "text":
        ids = _encode(tokenizer, f["text"], special=True) + _eos(tokenizer)
        labels = list(ids)
    elif format == "prompt_completion":
        prompt = _encode(tokenizer, f["prompt"], special=True)
        completion = _encode(tokenizer, f["completion"], special=False) + _eos(tokenizer)
        ids = prompt + completion
        labels = (prompt if train_on_prompt else [IGNORE_INDEX] * len(prompt)) + completion
    else:
        ids, labels = _tokenize_chat(record, tokenizer, train_on_prompt=train_on_prompt)
    if len(ids) < 2:
        raise ValueError(f"{record.source}: the record tokenizes to {len(ids)} token(s); a sample needs at least 2")
    labels[0] = IGNORE_INDEX
    if all(v == IGNORE_INDEX for v in labels):
        raise ValueError(f"{record.source}: no token of the record is trained (empty completion or assistant turns)")
    return Sample(ids, labels, record.source)


def _encode(tokenizer, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _eos(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def _tokenize_chat(record: Record, tokenizer, *, train_on_prompt: bool) -> tuple[list[int], list[int]]:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{record.source}: chat records need a tokenizer with a chat template, and this one has none; "
            "use prompt/completion records or a model directory whose tokenizer has one"
        )
    messages = record.fields["messages"]

    def render(upto: int, generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=generation_prompt)

    full = render(len(messages), False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(index, True) if index else "", render(index + 1, False)
        if not (through.startswith(before) and full.startswith(through)):
            raise ValueError(
                f"{record.source}: the tokenizer's chat template does not render this conversation turn by turn "
                "(a prefix of the chat is not a prefix of its rendering), so the assistant turns cannot be found; "
                "use prompt/completion records instead"
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    if train_on_prompt:
        return ids, list(ids)
    labels = [
        token if any(lo <= start < hi for lo, hi in spans) else IGNORE_INDEX
        for token, (start, _end) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    return ids, labels


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what makes this tokenizer's output: its vocabulary, special tokens and chat template."""
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    special = [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]
    digest.update(json.dumps([special, getattr(tokenizer, "chat_template", None) or ""]).encode())
    return digest.hexdigest()[:16]


def cache_key(path, tokenizer, *, format: str, train_on_prompt: bool) -> str:
    """The cache directory name for ``path`` tokenized by ``tokenizer`` with these options."""
    digest = hashlib.sha256()
    for file in data_files(path):
        digest.update(os.path.basename(file).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    options = json.dumps([CACHE_VERSION, format, train_on_prompt, tokenizer_fingerprint(tokenizer)])
    digest.update(options.encode())
    return digest.hexdigest()[:24]


def tokenize_records(records, format: str, tokenizer, *, train_on_prompt: bool, progress: bool = True) -> list[Sample]:
    """Every record tokenized, with a progress bar when ``progress``."""
    from tqdm import tqdm

    bar = tqdm(records, desc="tokenize", unit="sample", disable=not progress, dynamic_ncols=True, leave=False)
    return [tokenize_record(r, format, tokenizer, train_on_prompt=train_on_prompt) for r in bar]


def save_samples(samples: list[Sample], directory: str) -> None:
    """Write ``samples`` as a ``datasets`` Arrow directory (via a temporary name, renamed when complete)."""
    from datasets import Dataset
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    columns = {
        "input_ids": [s.input_ids for s in samples],
        "labels": [s.labels for s in samples],
        "source": [s.source for s in samples],
    }
    partial = f"{directory}.partial-{os.getpid()}"
    quiet = are_progress_bars_disabled()
    disable_progress_bars()  # a bar for writing a few MB would only clutter the run's output
    try:
        Dataset.from_dict(columns).save_to_disk(partial)
    finally:
        if not quiet:
            enable_progress_bars()
    os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
    try:
        os.rename(partial, directory)
    except OSError:  # another process finished the same cache first: theirs is identical
        import shutil

        shutil.rmtree(partial, ignore_errors=True)


def load_samples(directory: str) -> list[Sample]:
    """What ``save_samples`` wrote."""
    from datasets import load_from_disk

    dataset = load_from_disk(directory)
    return [Sample(list(r["input_ids"]), list(r["labels"]), r["source"]) for r in dataset]
