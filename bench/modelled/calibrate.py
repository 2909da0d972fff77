"""Calibration: each system's modelled CPU tokens/s against the tokens/s measured on the same CPU.

    errors = calibrate({"roundrobin": 812.0, "zero-infinity": 455.0}, point=cpu_point(shape))

``measured`` maps a system name to its measured tokens/s (``python -m bench.measured`` feeds it: its
``calibration`` module builds the point from the scenario and writes the table into
bench/results/measured.md); the prediction for each comes from the ``cpu`` hardware profile measured on
that machine (``cpu_profile``), at the same shape, devices, sequence and batch. The error is predicted
over measured minus one: +0.25 means the model is 25% optimistic. The models are not refitted to the
measured numbers: the table reports how far they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bubbleless_partition import Hardware, TransformerShape, load_hardware

from .common import Point
from .cpu_profile import DEFAULT_PATH
from .registry import predict


@dataclass(frozen=True)
class CalibrationRow:
    system: str
    measured_tokens_per_s: float
    predicted_tokens_per_s: float

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted_tokens_per_s / self.measured_tokens_per_s - 1.0


def cpu_hardware(path: str | Path = DEFAULT_PATH) -> Hardware:
    """The measured ``cpu`` profile (``bench/model.py --measure-cpu`` writes it)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no measured CPU profile at {path}; run `python bench/model.py --measure-cpu` first")
    return load_hardware(path)


def cpu_point(shape: TransformerShape, *, hardware: Hardware | None = None, **fields) -> Point:
    """A point on the measured CPU (``fields``: gpus = CPU devices or ranks, seq_len, batches, precision)."""
    return Point(shape=shape, hardware=hardware or cpu_hardware(), **{"gpus": 2, "seq_len": 128, **fields})


def calibrate(measured: dict[str, float], *, point: Point) -> list[CalibrationRow]:
    """One row per measured system: measured and modelled tokens/s at ``point`` and the error."""
    rows = []
    for system, tokens_per_s in sorted(measured.items()):
        if not tokens_per_s > 0:
            raise ValueError(f"measured tokens/s of {system!r} must be positive, got {tokens_per_s!r}")
        rows.append(CalibrationRow(system, float(tokens_per_s), predict(system, point).tokens_per_s))
    return rows


def calibration_table(rows: list[CalibrationRow]) -> str:
    lines = ["| system | measured tokens/s | modelled tokens/s | error (modelled/measured - 1) |",
             "|---|---|---|---|"]
    lines += [f"| {r.system} | {r.measured_tokens_per_s:,.1f} | {r.predicted_tokens_per_s:,.1f} | {r.error:+.1%} |"
              for r in rows]
    return "\n".join(lines)
