"""Calibration: each system's modelled CPU tokens/s against the tokens/s measured on the same CPU.

    errors = calibrate({"roundrobin": 812.0, "zero-infinity": 455.0}, point=cpu_point(shape))

``measured`` maps a system name to its measured tokens/s (``python -m bench.measured`` feeds it: its
``calibration`` module builds the point from the scenario and writes the table into
bench/results/measured.md); the prediction for each comes from the ``cpu`` hardware profile measured on
that machine (``cpu_profile``), at the same shape, devices, sequence and batch. The error is predicted
over measured minus one: +0.25 means the model is 25% optimistic. The models are not refitted to the
measured numbers: the table reports how far they are.

``load_free`` (optional) maps a system to its measured tokens/s with each step's run-queue wait taken out
(bench/measured/common.py: time the step's ranks were runnable while other processes held the cores);
the profile is timed by thread CPU time, so that is the figure it predicts, and both errors are shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bubbleless_partition import Hardware, TransformerShape

from .common import Point
from .cpu_ops import load_cpu_profile
from .cpu_profile import DEFAULT_PATH
from .registry import predict


@dataclass(frozen=True)
class CalibrationRow:
    system: str
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    load_free_tokens_per_s: float | None = None
    """Measured, each step less its run-queue wait; None where the run did not record it."""

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_tokens_per_s / self.measured_tokens_per_s - 1.0

    @property
    def load_free_error(self) -> float | None:
        """predicted / (measured less the wait) - 1."""
        if self.load_free_tokens_per_s is None:
            return None
        return self.predicted_tokens_per_s / self.load_free_tokens_per_s - 1.0


def cpu_hardware(path: str | Path = DEFAULT_PATH) -> Hardware:
    """The measured ``cpu`` profile with its small-op rates (``bench/model.py --measure-cpu`` writes both)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no measured CPU profile at {path}; run `python bench/model.py --measure-cpu` first")
    return load_cpu_profile(path)


def cpu_point(shape: TransformerShape, *, hardware: Hardware | None = None, **fields) -> Point:
    """A point on the measured CPU (``fields``: gpus = CPU devices or ranks, seq_len, batches, precision)."""
    return Point(shape=shape, hardware=hardware or cpu_hardware(), **{"gpus": 2, "seq_len": 128, **fields})


def calibrate(measured: dict[str, float], *, point: Point,
              load_free: dict[str, float] | None = None) -> list[CalibrationRow]:
    """One row per measured system: measured (and load-free) and modelled tokens/s at ``point``."""
    load_free = load_free or {}
    rows = []
    for system, tokens_per_s in sorted(measured.items()):
        for label, value in (("measured", tokens_per_s), ("load-free", load_free.get(system, 1.0))):
            if not value > 0:
                raise ValueError(f"{label} tokens/s of {system!r} must be positive, got {value!r}")
        free = load_free.get(system)
        rows.append(CalibrationRow(system, float(tokens_per_s), predict(system, point).tokens_per_s,
                                   None if free is None else float(free)))
    return rows


def calibration_table(rows: list[CalibrationRow]) -> str:
    lines = ["| system | measured tokens/s | measured less run-queue wait | modelled tokens/s | "
             "error vs measured | error vs measured less wait |", "|---|---|---|---|---|---|"]
    for r in rows:
        free = "-" if r.load_free_tokens_per_s is None else f"{r.load_free_tokens_per_s:,.1f}"
        free_error = "-" if r.load_free_error is None else f"{r.load_free_error:+.1%}"
        lines.append(f"| {r.system} | {r.measured_tokens_per_s:,.1f} | {free} | {r.predicted_tokens_per_s:,.1f} | "
                     f"{r.error:+.1%} | {free_error} |")
    return "\n".join(lines)
