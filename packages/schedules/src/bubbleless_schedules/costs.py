"""Costs of each kind of action, per rank or per stage.

``Costs(forward, backward_input, backward_weight, comm)`` gives the cost of one micro-batch through a
rank's *whole share* of the model, as the zero-bubble papers profile it. A schedule with ``v`` stages per
rank (interleaved, V-shaped) gives each stage ``cost / v``. Any field may instead be a sequence with one
value per stage, for heterogeneous stages (an embedding stage, a heavy LM-head stage); those values are
per stage and are used as given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from .action import Kind

Number = float | int
PerStage = Number | Sequence[Number]


def _check_field(name: str, value: PerStage) -> None:
    values = value if isinstance(value, Sequence) else [value]
    if isinstance(value, Sequence) and not values:
        raise ValueError(f"Costs.{name} is an empty sequence: give one value per stage, or a single number")
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item < 0:
            raise ValueError(f"Costs.{name} must be finite non-negative numbers, got {value!r}")


class StageCountError(ValueError):
    """Per-stage costs whose length is not the schedule's stage count (``Costs.check_stages``); its own
    class so that ``auto``, which tries schedules of several stage counts, can tell this refusal apart."""

    def __init__(self, given: int, num_stages: int) -> None:
        super().__init__(
            f"costs give {given} per-stage values but the schedule has {num_stages} stages; "
            f"give one value per stage or single numbers"
        )
        self.given = given
        self.num_stages = num_stages

    def __reduce__(self):  # the default would call __init__ with the message alone
        return type(self), (self.given, self.num_stages)


# kind -> (the cost fields it adds up, whether a per-rank number is split over the rank's v stages)
_FIELDS_OF_KIND: dict[Kind, tuple[tuple[str, ...], bool]] = {
    Kind.F: (("forward",), True),
    Kind.I: (("backward_input",), True),
    Kind.W: (("backward_weight",), True),
    Kind.B: (("backward_input", "backward_weight"), True),
    Kind.R: (("recompute",), True),
    Kind.LOAD: (("load",), False),
    Kind.STORE: (("store",), False),
}


@dataclass(frozen=True)
class Costs:
    """Per-micro-batch costs. Units are yours (ms, or 1 for unit costs)."""

    forward: PerStage = 1.0
    """F: forward through the rank's whole share (or one value per stage)."""
    backward_input: PerStage = 1.0
    """I: input-gradient backward (B in the zero-bubble papers)."""
    backward_weight: PerStage = 1.0
    """W: weight-gradient backward."""
    comm: float = 0.0
    """C: latency of one point-to-point transfer between two different workers."""
    recompute: PerStage | None = None
    """R: recomputing a stage's forward before its backward; defaults to the forward cost."""
    load: PerStage = 0.0
    """LOAD: uploading one stage's weights to a worker (round-robin), per stage."""
    store: PerStage = 0.0
    """STORE: downloading one stage's gradients from a worker (round-robin), per stage."""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    """Free-form notes (profile name, units) carried along for reports."""

    def __post_init__(self) -> None:
        for name in ("forward", "backward_input", "backward_weight", "load", "store"):
            _check_field(name, getattr(self, name))
        if self.recompute is not None:
            _check_field("recompute", self.recompute)
        if isinstance(self.comm, Sequence):
            raise ValueError(
                f"Costs.comm must be one number (the latency of one transfer between workers), got {self.comm!r}"
            )
        _check_field("comm", self.comm)
        for name in ("forward", "backward_input", "backward_weight", "recompute", "load", "store"):
            value = getattr(self, name)
            if isinstance(value, Sequence):
                object.__setattr__(self, name, tuple(float(v) for v in value))

    @classmethod
    def unit(cls) -> Costs:
        """F = I = W = 1, no communication: the setting of the papers' closed forms."""
        return cls(1.0, 1.0, 1.0, 0.0)

    @classmethod
    def parse(cls, text: str) -> Costs:
        """Read ``"F,I,W"`` or ``"F,I,W,C"`` (the CLI's ``--costs``)."""
        try:
            values = [float(x) for x in text.split(",")]
        except ValueError:
            values = []
        if len(values) not in (3, 4):
            raise ValueError(f"--costs takes F,I,W or F,I,W,C as numbers (e.g. 18.5,18.1,9.3,0.6), got {text!r}")
        try:
            return cls(*values)
        except ValueError as exc:  # inf or nan parse as floats; say which flag held them
            raise ValueError(f"--costs {text!r}: {exc}; give finite numbers, e.g. 18.5,18.1,9.3,0.6") from None

    @property
    def heterogeneous(self) -> bool:
        return any(
            isinstance(getattr(self, name), tuple)
            for name in ("forward", "backward_input", "backward_weight", "recompute", "load", "store")
        )

    def num_stages_given(self) -> int | None:
        """The stage count the per-stage sequences imply (None when every field is a number)."""
        lengths = {
            len(v)
            for v in (self.forward, self.backward_input, self.backward_weight, self.recompute, self.load, self.store)
            if isinstance(v, tuple)
        }
        if len(lengths) > 1:
            raise ValueError(f"per-stage cost sequences differ in length: {sorted(lengths)}; give one value per stage")
        return lengths.pop() if lengths else None

    def check_stages(self, num_stages: int) -> None:
        given = self.num_stages_given()
        if given is not None and given != num_stages:
            raise StageCountError(given, num_stages)

    def of(self, kind: Kind, stage: int, stages_per_rank: float = 1.0) -> float:
        """Cost of one action of ``kind`` on ``stage`` (communication kinds cost nothing to issue)."""
        fields, scaled = _FIELDS_OF_KIND.get(kind, ((), False))
        return sum((self._value(name, stage, stages_per_rank if scaled else 1.0) for name in fields), 0.0)

    def _value(self, name: str, stage: int, stages_per_rank: float) -> float:
        if name == "recompute" and self.recompute is None:
            name = "forward"
        value = getattr(self, name)
        if isinstance(value, tuple):
            return value[stage]
        return float(value) / stages_per_rank

    def median(self) -> Costs:
        """The same costs with every per-stage sequence replaced by its median (a homogeneous view)."""

        def med(v):
            return tuple([float(median(v))] * len(v)) if isinstance(v, tuple) else v

        return Costs(
            med(self.forward), med(self.backward_input), med(self.backward_weight), self.comm,
            None if self.recompute is None else med(self.recompute), med(self.load), med(self.store),
        )
