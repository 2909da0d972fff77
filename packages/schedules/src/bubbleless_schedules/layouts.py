"""Dependency rules: what each action needs before it may start, and what it leaves behind.

The validator and the simulator know nothing about particular schedules; they ask the schedule's
layout. A layout answers, for one action:

- ``requires``: the events that must have happened (an event is a small tuple such as
  ``("F", stage, mb)``, "stage's forward output for mb exists");
- ``produces``: the events the action makes happen;
- ``memory_delta``: the activation memory (in M_B) the action adds to its worker (negative frees);
- ``cost``: how long it takes under given ``Costs``;
- ``missing``: which actions a complete schedule must have and this one lacks.

An event produced on one worker and required on another is seen ``costs.comm`` later. New placements
with other dependency shapes (round-robin pools, for one) register a layout here; the core does not change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Protocol

from .action import COMM_KINDS, Action, Kind
from .costs import Costs

Event = tuple


class Layout(Protocol):
    def requires(self, action: Action, schedule) -> tuple[Event, ...]: ...

    def produces(self, action: Action, schedule) -> tuple[Event, ...]: ...

    def memory_delta(self, action: Action, schedule, input_grad_frees: float) -> float: ...

    def cost(self, action: Action, schedule, costs: Costs) -> float: ...

    def missing(self, schedule) -> list[str]: ...


_LAYOUTS: dict[str, Layout] = {}


def register_layout(name: str) -> Callable[[type], type]:
    """Class decorator: ``@register_layout("pipeline")`` makes the rule available by name."""

    def wrap(cls: type) -> type:
        _LAYOUTS[name] = cls()
        return cls

    return wrap


def layout_of(schedule) -> Layout:
    try:
        return _LAYOUTS[schedule.layout]
    except KeyError:
        raise ValueError(
            f"schedule layout {schedule.layout!r} is unknown; known layouts: {sorted(_LAYOUTS)}"
        ) from None


@register_layout("pipeline")
class PipelineLayout:
    """Stage-bound pipelines: stage s feeds s+1 forward and s-1 backward.

    Events: ``("F", s, m)`` forward output of stage s; ``("G", s, m)`` gradient w.r.t. stage s's input
    (made by I or B); ``("W", s, m)`` weight gradient done; ``("SENT", kind, s, m)`` a lowered send issued.
    """

    def requires(self, action: Action, schedule) -> tuple[Event, ...]:
        s, m, kind, last = action.stage, action.microbatch, action.kind, schedule.num_stages - 1
        if kind is Kind.F:
            return (("F", s - 1, m),) if s > 0 else ()
        if kind in (Kind.I, Kind.B):
            return (("F", s, m),) + ((("G", s + 1, m),) if s < last else ())
        if kind is Kind.W:
            return (("G", s, m),)
        if kind is Kind.SEND_F:
            return (("F", s, m),)
        if kind is Kind.SEND_B:
            return (("G", s, m),)
        if kind is Kind.RECV_F:
            return (("SENT", Kind.SEND_F, s - 1, m),)
        if kind is Kind.RECV_B:
            return (("SENT", Kind.SEND_B, s + 1, m),)
        raise ValueError(f"action {action} has no meaning in a stage-bound pipeline")

    def produces(self, action: Action, schedule) -> tuple[Event, ...]:
        s, m, kind = action.stage, action.microbatch, action.kind
        if kind is Kind.F:
            return (("F", s, m),)
        if kind is Kind.I:
            return (("G", s, m),)
        if kind is Kind.B:
            return (("G", s, m), ("W", s, m))
        if kind is Kind.W:
            return (("W", s, m),)
        if kind in (Kind.SEND_F, Kind.SEND_B):
            return (("SENT", kind, s, m),)
        return (("RECEIVED", kind, s, m),)

    def memory_delta(self, action: Action, schedule, input_grad_frees: float) -> float:
        share = 1.0 / schedule.stages_per_rank
        return {
            Kind.F: share,
            Kind.I: -input_grad_frees * share,
            Kind.W: -(1.0 - input_grad_frees) * share,
            Kind.B: -share,
        }.get(action.kind, 0.0)

    def cost(self, action: Action, schedule, costs: Costs) -> float:
        return costs.of(action.kind, action.stage, schedule.stages_per_rank)

    def missing(self, schedule) -> list[str]:
        """Every (stage, mb) needs one F and either one B or one I and one W."""
        counts = Counter(a for _, _, a in schedule.all_actions() if a.kind not in COMM_KINDS)
        problems = []
        for s in range(schedule.num_stages):
            for m in range(schedule.num_microbatches):
                if counts[Action(s, Kind.F, m)] != 1:
                    problems.append(f"stage {s} micro-batch {m} has {counts[Action(s, Kind.F, m)]} forwards, needs 1")
                b, i, w = (counts[Action(s, k, m)] for k in (Kind.B, Kind.I, Kind.W))
                if not ((b == 1 and i == 0 and w == 0) or (b == 0 and i == 1 and w == 1)):
                    problems.append(
                        f"stage {s} micro-batch {m} has {b} B, {i} I, {w} W; needs one B, or one I and one W"
                    )
        return problems
