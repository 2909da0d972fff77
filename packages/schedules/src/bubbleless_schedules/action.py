"""The action record: one unit of work a worker performs, printed like ``2F0``.

An action names a stage, a kind and a micro-batch. Compute kinds come from the generators; the
lowering passes add communication and transfer kinds. The text form is ``<stage><KIND><microbatch>``
(``2F0``, ``3SEND_F1``); kinds that act on a whole stage rather than one micro-batch (weight loads,
gradient stores) print without a micro-batch (``3LOAD``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    """What an action does. The value is its text form."""

    F = "F"  #: forward of one micro-batch through one stage
    I = "I"  # noqa: E741  input-gradient backward (on the critical path)
    W = "W"  #: weight-gradient backward (free to move into idle slots)
    B = "B"  #: full backward: I and W fused
    R = "R"  #: recompute a stage's forward before its backward (round-robin)
    SEND_F = "SEND_F"  #: send the forward activation to the next stage's worker
    RECV_F = "RECV_F"  #: receive the forward activation from the previous stage's worker
    SEND_B = "SEND_B"  #: send the input gradient to the previous stage's worker
    RECV_B = "RECV_B"  #: receive the gradient from the next stage's worker
    LOAD = "LOAD"  #: upload a stage's weights to the worker (round-robin)
    STORE = "STORE"  #: download a stage's gradients from the worker and drop its weights (round-robin)

    def __str__(self) -> str:
        return self.value


COMPUTE_KINDS = frozenset({Kind.F, Kind.I, Kind.W, Kind.B, Kind.R})
COMM_KINDS = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
STAGE_KINDS = frozenset({Kind.LOAD, Kind.STORE})  # act on a whole stage: no micro-batch

_KIND_PATTERN = "|".join(sorted((k.value for k in Kind), key=len, reverse=True))
_ACTION_RE = re.compile(rf"^(\d+)({_KIND_PATTERN})(\d*)$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One unit of work: ``Action(2, Kind.F, 0)`` prints as ``2F0``."""

    stage: int
    kind: Kind
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            object.__setattr__(self, "kind", Kind(self.kind))
        if self.stage < 0:
            raise ValueError(f"action stage must be >= 0, got {self.stage}")
        if self.kind in STAGE_KINDS:
            if self.microbatch is not None:
                raise ValueError(f"{self.kind} acts on a whole stage and takes no micro-batch")
        elif self.microbatch is None or self.microbatch < 0:
            raise ValueError(f"{self.kind} needs a micro-batch index >= 0, got {self.microbatch}")

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind.value}{mb}"

    def __repr__(self) -> str:
        return f"Action({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> Action:
        """Read an action back from its text form: ``Action.parse("2F0")``."""
        match = _ACTION_RE.match(text.strip())
        if not match:
            kinds = ", ".join(k.value for k in Kind)
            raise ValueError(
                f"cannot parse action {text!r}: expected <stage><kind><microbatch> such as '2F0', "
                f"with kind one of {kinds}"
            )
        stage, kind, mb = match.groups()
        return cls(int(stage), Kind(kind), int(mb) if mb else None)


def F(stage: int, mb: int) -> Action:  # noqa: N802 - reads like the text form
    return Action(stage, Kind.F, mb)


def I(stage: int, mb: int) -> Action:  # noqa: N802, E741, E743
    return Action(stage, Kind.I, mb)


def W(stage: int, mb: int) -> Action:  # noqa: N802
    return Action(stage, Kind.W, mb)


def B(stage: int, mb: int) -> Action:  # noqa: N802
    return Action(stage, Kind.B, mb)
