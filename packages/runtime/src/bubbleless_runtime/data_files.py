"""A user's training data from local files: read every record, check its shape, name the file and line.

``data.path`` is a JSONL file (one record per line), a JSON file (a list of records), a plain-text file
(one ``{"text": ...}`` record per paragraph, paragraphs separated by blank lines, read with the
``datasets`` library's text loader), or a directory of such files (read in sorted name order). Records:

- ``{"text": "..."}``: language modelling, every token trained;
- ``{"prompt": "...", "completion": "..."}``: the loss counts the completion only (unless
  ``data.train_on_prompt``);
- ``{"messages": [{"role": ..., "content": ...}, ...]}``: a chat, rendered with the tokenizer's chat
  template; the loss counts the assistant turns only.

Files are UTF-8 (a byte-order mark, as Windows editors write one, is skipped); another encoding is
refused naming the file and the first byte that is not UTF-8. Every record of a run has the same format (``data.format``, or ``auto``: the first record's keys). A
record that does not fit raises ``ValueError`` naming the file and line, before anything is tokenized.
Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

FORMATS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion"),
    "messages": ("messages",),
}
"""Record format name -> the keys its records must have."""

SUFFIXES = (".jsonl", ".json", ".txt")
"""The file kinds ``data.path`` may name (or a directory may hold)."""

ROLES = ("system", "user", "assistant", "tool")

ENCODING = "utf-8-sig"
"""How data files are read: UTF-8, a leading byte-order mark skipped."""


@dataclass(frozen=True, kw_only=True)
class Record:
    """One sample as read, with where it came from (for error messages)."""

    fields: dict
    """The record's fields (``text``; ``prompt`` and ``completion``; or ``messages``)."""
    source: str
    """``file:line`` (JSONL, text: the paragraph's first line) or ``file[index]`` (a JSON list)."""


def data_files(path: str | os.PathLike) -> list[str]:
    """The files ``path`` names: itself, or the data files of a directory in sorted order."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(SUFFIXES))
        if not files:
            raise ValueError(f"data.path {path!r} is a directory with no {'/'.join(SUFFIXES)} files; put the data there")
        return files
    if not os.path.isfile(path):
        raise ValueError(f"data.path {path!r} does not exist; point it at a local .jsonl, .json or .txt file or a directory")
    if not path.endswith(SUFFIXES):
        raise ValueError(f"data.path {path!r} is not a {', '.join(SUFFIXES)} file; convert it to JSONL")
    return [path]


def read_records(path: str | os.PathLike, *, format: str = "auto") -> tuple[str, list[Record]]:
    """(the format, every record of ``path``), each record checked; ``ValueError`` naming file and line."""
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"data.format {format!r} is unknown; choose auto or one of {sorted(FORMATS)}")
    records: list[Record] = []
    for file in data_files(path):
        found = list(_read_file(file))
        if not found:
            raise ValueError(f"{file}: the file holds no records; remove it or add samples")
        records += found
    if format == "auto":
        format = _format_of(records[0])
    for record in records:
        check_record(record, format)
    return format, records


def _read_file(file: str):
    text = _utf8(file)
    if file.endswith(".jsonl"):
        for number, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                yield Record(fields=_parse(line, f"{file}:{number}"), source=f"{file}:{number}")
    elif file.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{file}:{error.lineno}: not valid JSON ({error.msg})") from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise ValueError(f"{file}: expected a JSON list of records, got {type(data).__name__}")
        for index, item in enumerate(data):
            if not isinstance(item, dict):
                raise ValueError(f"{file}[{index}]: a record must be a JSON object, got {type(item).__name__}")
            yield Record(fields=item, source=f"{file}[{index}]")
    else:
        yield from _read_text(file, text)


def _utf8(file: str) -> str:
    """The file's text; ``ValueError`` naming the file and where it stops being UTF-8."""
    with open(file, "rb") as handle:
        raw = handle.read()
    try:
        return raw.decode(ENCODING)
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ValueError(f"{file}:{line}: not UTF-8 text (byte 0x{raw[error.start]:02x} at offset {error.start}); "
                         "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def _read_text(file: str, text: str):
    """Paragraphs (blank-line separated) of a plain-text file, through ``datasets``' text loader."""
    from datasets import load_dataset

    dataset = load_dataset("text", data_files=file, sample_by="paragraph", split="train", encoding=ENCODING)
    # datasets drops the line numbers; recover each paragraph's first line for error messages
    starts, previous_blank = [], True
    for number, line in enumerate(text.split("\n"), start=1):
        blank = not line.strip()
        if previous_blank and not blank:
            starts.append(number)
        previous_blank = blank
    for index, row in enumerate(dataset):
        text = row["text"].strip("\n")
        if text.strip():
            line = starts[index] if index < len(starts) else index + 1
            yield Record(fields={"text": text}, source=f"{file}:{line}")


def _parse(line: str, where: str) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(value).__name__}")
    return value


def _format_of(record: Record) -> str:
    for name, keys in FORMATS.items():
        if all(k in record.fields for k in keys):
            return name
    raise ValueError(
        f"{record.source}: cannot tell the record format from its keys {sorted(record.fields)}; "
        'give {"text": ...}, {"prompt": ..., "completion": ...} or {"messages": [...]} (or set data.format)'
    )


def check_record(record: Record, format: str) -> None:
    """``ValueError`` naming the record's file and line when it does not fit ``format``."""
    where, fields = record.source, record.fields
    missing = [k for k in FORMATS[format] if k not in fields]
    if missing:
        raise ValueError(f"{where}: missing field {missing[0]!r} (data format {format} needs {list(FORMATS[format])})")
    if format != "messages":
        for key in FORMATS[format]:
            if not isinstance(fields[key], str):
                raise ValueError(f"{where}: field {key!r} must be a string, got {type(fields[key]).__name__}")
        if format == "text" and not fields["text"].strip():
            raise ValueError(f"{where}: field 'text' is empty; remove the record")
        if format == "prompt_completion" and not fields["completion"].strip():
            raise ValueError(f"{where}: field 'completion' is empty; the record has nothing to train on")
        return
    messages = fields["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str) or "role" not in message:
            raise ValueError(f"{where}: messages[{index}] needs a 'role' and a string 'content'")
        if message["role"] not in ROLES:
            raise ValueError(f"{where}: messages[{index}] has role {message['role']!r}; use one of {list(ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: the chat has no assistant turn, so nothing to train on; add one or drop the record")


DTYPES = ("fp32", "bf16", "fp16")
"""``model.dtype`` values (the torch dtypes live in ``models.hf.DTYPES``; this list needs no torch)."""


def check_data_config(config) -> None:
    """The ``data`` fields of a ``RunConfig`` (and ``model.dtype``, ``train.eval_every``) that need no
    file read; ``ValueError`` naming the field. Called from ``config_checks.validate``."""
    d = config.data
    if config.model.dtype not in DTYPES:
        raise ValueError(f"model.dtype is {config.model.dtype!r}; choose one of {list(DTYPES)}")
    if config.train.eval_every < 0:
        raise ValueError(f"train.eval_every must be 0 (at the end only) or positive, got {config.train.eval_every}")
    if d.format != "auto" and d.format not in FORMATS:
        raise ValueError(f"data.format is {d.format!r}; choose auto or one of {sorted(FORMATS)}")
    if d.truncation not in ("truncate", "drop"):
        raise ValueError(f"data.truncation is {d.truncation!r}; choose truncate or drop")
    if not 0.0 <= d.validation_fraction < 1.0:
        raise ValueError(f"data.validation_fraction must be in [0, 1), got {d.validation_fraction}")
    if d.validation_fraction and d.validation_path:
        raise ValueError("give data.validation_fraction or data.validation_path, not both")
    if d.path is None:
        if d.validation_fraction or d.validation_path:
            raise ValueError("data.validation_fraction and data.validation_path need data.path (the synthetic "
                             "task has no validation split)")
        return
    if config.model.path is None:
        raise ValueError(
            "data.path needs model.path: the data is tokenized with the model's tokenizer; point model.path "
            "at a local Hugging Face directory (`bubbleless fetch-example-model DIR` writes one)"
        )
    if d.seq_len < 2:
        raise ValueError(f"data.seq_len must be at least 2, got {d.seq_len}")
