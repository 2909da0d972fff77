"""Every training step as a line of ``metrics.jsonl`` in the output directory, and in TensorBoard.

One JSON object per line, written and flushed as the step ends, so a run that is killed keeps every
step it finished: ``{"step": 12, "loss": 2.31, "lr": 0.001, "grad_norm": 0.84, "tokens_per_second":
5120.0}`` (tokens that are not padding: ``trainer.real_tokens``), plus ``eval_loss`` (and any other number) on the steps that have one. A field that is None
is left out; a NaN (the grad norm of a skipped fp16 step) is written as ``null``, since JSON has no NaN.

A resumed run opens the writer with the checkpoint's step: lines of later steps (written by the run
that was killed after its last checkpoint, and about to be trained again) are dropped first, so each
step appears once. With ``tensorboard`` installed, the same numbers go to ``DIR/tensorboard`` as
scalars ``train/<field>`` (``eval/<field>`` for fields starting with ``eval_``), purged past the same
step on resume.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (a file, or the directory holding one), in file order; an
    empty list when there is none. A last line cut short by a kill is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) and not text.endswith("\n"):  # the line a kill cut short
                break
            raise ValueError(f"{path}:{number} is not a JSON line: {line[:80]!r}") from None
    return records


def _tensorboard_writer(directory: str, purge_step: int | None):
    """A ``SummaryWriter`` under ``directory``, or None when TensorBoard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard needs the tensorboard package
        return None
    return SummaryWriter(log_dir=directory, purge_step=purge_step)


class MetricsWriter:
    """Appends one line per step to ``DIR/metrics.jsonl`` (and TensorBoard scalars when installed).

    ``resume_step``: the step the run starts from (a checkpoint's; 0 for a fresh run). Lines of
    steps after it are removed when the writer opens, so the steps about to run again are not
    duplicated; a fresh run (0) starts a new file. ``tensorboard``: False never writes TensorBoard
    events; True or None write them when ``torch.utils.tensorboard`` imports (True is not an error
    without it: the JSONL is the record, TensorBoard a view of it).
    """

    def __init__(self, directory: str | Path, *, resume_step: int = 0, tensorboard: bool | None = None) -> None:
        if resume_step < 0:
            raise ValueError(f"resume_step must be 0 (a fresh run) or a checkpoint's step, got {resume_step}")
        self.directory = Path(directory)
        self.path = self.directory / METRICS_FILE
        self.resume_step = resume_step
        self.want_tensorboard = tensorboard is not False
        self._file = None
        self.tensorboard = None

    def open(self) -> MetricsWriter:
        """Create the directory, keep the lines of steps up to ``resume_step`` and open for appending."""
        self.directory.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= self.resume_step] if self.resume_step else []
        with open(self.path, "w") as file:  # rewritten whole: a kill here loses nothing kept
            file.writelines(json.dumps(r) + "\n" for r in kept)
        self._file = open(self.path, "a")
        if self.want_tensorboard:
            # purge_step: events at or after it, from the run that died, are dropped when new ones arrive
            purge = self.resume_step + 1 if self.resume_step else None
            self.tensorboard = _tensorboard_writer(str(self.directory / TENSORBOARD_DIR), purge)
        return self

    def log(self, step: int, **fields: float | None) -> dict:
        """Write one step's line (every field of the step in one call) and flush it; returns the record."""
        if self._file is None:
            raise ValueError("MetricsWriter.log before open(): use `with MetricsWriter(dir) as metrics:`")
        record: dict = {"step": int(step)}
        for name, value in fields.items():
            if value is None:
                continue
            value = float(value)
            record[name] = None if math.isnan(value) or math.isinf(value) else value
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.tensorboard is not None:
            for name, value in record.items():
                if name != "step" and value is not None:
                    tag = f"eval/{name[len('eval_'):]}" if name.startswith("eval_") else f"train/{name}"
                    self.tensorboard.add_scalar(tag, value, global_step=record["step"])
            self.tensorboard.flush()
        return record

    def log_stats(self, stats, **extra: float | None) -> dict:
        """Log a Trainer ``StepStats`` (loss, lr, grad norm, and ``tokens_per_second``: this rank's
        non-padding tokens over the step's seconds) and ``extra`` fields (``eval_loss=`` on steps that
        evaluate)."""
        return self.log(stats.step, loss=stats.loss, lr=stats.lr, grad_norm=stats.grad_norm,
                        tokens_per_second=stats.tokens / max(stats.seconds, 1e-9), **extra)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def __enter__(self) -> MetricsWriter:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def open_metrics(directory: str | Path, *, rank: int, resume_step: int = 0) -> MetricsWriter | None:
    """The writer rank 0 logs with (opened), None on the other ranks: every rank has the same numbers."""
    if rank != 0:
        return None
    return MetricsWriter(os.fspath(directory), resume_step=resume_step).open()
