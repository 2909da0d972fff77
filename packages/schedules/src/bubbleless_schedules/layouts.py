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
from importlib import import_module
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


_BUILTIN_LAYOUT_MODULES = {"roundrobin": ".roundrobin_layout"}
"""Layouts defined outside this module, imported on first use so every schedule of theirs simulates."""


def layout_of(schedule) -> Layout:
    module = _BUILTIN_LAYOUT_MODULES.get(schedule.layout)
    if schedule.layout not in _LAYOUTS and module is not None:
        import_module(module, __package__)  # registers the layout on import
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
    (made by I or B); ``("W", s, m)`` weight gradient done; ``("SENT", kind, s, m)`` a lowered send issued;
    ``("RECEIVED", kind, s, m)`` a lowered receive completed.

    A schedule lowered by ``lowering.add_communication`` carries ``meta.comm=1``: there a compute whose
    input comes from another rank requires its own local RECV (which requires the peer's SEND, seen
    ``costs.comm`` later) instead of the peer's compute. Without the flag, rules are as before.
    """

    def requires(self, action: Action, schedule) -> tuple[Event, ...]:
        s, m, kind, last = action.stage, action.microbatch, action.kind, schedule.num_stages - 1
        if kind is Kind.F:
            if s == 0:
                return ()
            return (_input_event(schedule, Kind.RECV_F, s, m) or ("F", s - 1, m),)
        if kind in (Kind.I, Kind.B):
            if s == last:
                return (("F", s, m),)
            return (("F", s, m), _input_event(schedule, Kind.RECV_B, s, m) or ("G", s + 1, m))
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

    def rule_rows(self, schedule, costs: Costs) -> tuple[list, list, list]:
        """``requires``, ``produces`` and ``cost`` of every action, row by row, for the simulator's inner
        loop: the unlowered F, I, B and W rules are spelled out here (the very tuples the methods return)
        and each kind and stage asks ``Costs.of`` once, instead of three method calls per action; any
        other action asks the methods. Equal to the per-action methods (tests/test_sched_speed.py)."""
        lowered, last = is_lowered(schedule), schedule.num_stages - 1
        requires, produces = [], []
        for row in schedule.actions:
            needs, makes = [], []
            for a in row:
                s, m, kind = a.stage, a.microbatch, a.kind
                if lowered or kind not in _PLAIN_KINDS:
                    needs.append(self.requires(a, schedule))
                    makes.append(self.produces(a, schedule))
                elif kind is Kind.F:
                    needs.append((("F", s - 1, m),) if s else ())
                    makes.append((("F", s, m),))
                elif kind is Kind.W:
                    needs.append((("G", s, m),))
                    makes.append((("W", s, m),))
                else:
                    needs.append((("F", s, m),) if s == last else (("F", s, m), ("G", s + 1, m)))
                    makes.append((("G", s, m),) if kind is Kind.I else (("G", s, m), ("W", s, m)))
            requires.append(needs)
            produces.append(makes)
        per_kind_stage: dict[tuple[Kind, int], float] = {}
        durations = []
        for row in schedule.actions:
            takes = []
            for a in row:
                key = (a.kind, a.stage)
                cost = per_kind_stage.get(key)
                if cost is None:
                    cost = per_kind_stage[key] = self.cost(a, schedule, costs)
                takes.append(cost)
            durations.append(takes)
        return requires, produces, durations

    def memory_rows(self, schedule, input_grad_frees: float) -> list[list[float]]:
        """``memory_delta`` of every action, row by row, from one table per schedule."""
        share = 1.0 / schedule.stages_per_rank
        g = input_grad_frees
        table = {Kind.F: share, Kind.I: -g * share, Kind.W: -(1.0 - g) * share, Kind.B: -share}
        return [[table.get(a.kind, 0.0) for a in row] for row in schedule.actions]

    def missing(self, schedule) -> list[str]:
        """Every (stage, mb) needs one F and either one B or one I and one W (and, when lowered, one
        SEND and one RECV for every edge between two ranks)."""
        problems = _missing_comm(schedule) if is_lowered(schedule) else []
        if not _computes_complete(schedule):
            problems += _missing_computes(schedule)
        return problems


_PLAIN_KINDS = frozenset({Kind.F, Kind.I, Kind.W, Kind.B})


def _computes_complete(schedule) -> bool:
    """True when ``_missing_computes`` would find nothing: F, I, W and B counted per (stage, mb) into
    flat lists and compared whole, a fast check for the usual case of a complete schedule."""
    stages, mbs = schedule.num_stages, schedule.num_microbatches
    size = stages * mbs
    counts = {kind: [0] * size for kind in _PLAIN_KINDS}
    for row in schedule.actions:
        for a in row:
            column = counts.get(a.kind)
            if column is not None and a.stage < stages and a.microbatch < mbs:
                column[a.stage * mbs + a.microbatch] += 1
    ones, zeros = [1] * size, [0] * size
    b, i, w = counts[Kind.B], counts[Kind.I], counts[Kind.W]
    if counts[Kind.F] != ones:
        return False
    if (b == ones and i == zeros and w == zeros) or (b == zeros and i == ones and w == ones):
        return True
    return all(biw in ((1, 0, 0), (0, 1, 1)) for biw in zip(b, i, w, strict=True))


def _missing_computes(schedule) -> list[str]:
    """What each (stage, mb) lacks or has twice among F, I, W and B, in stage and micro-batch order."""
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


def is_lowered(schedule) -> bool:
    """True for a stage-bound schedule that carries its own sends and receives (``meta.comm=1``)."""
    return schedule.meta.get("comm", (0,)) == (1,)


def _crosses_ranks(schedule, producer: int, consumer: int) -> bool:
    placement = schedule.stage_to_rank
    return placement is not None and placement[producer] != placement[consumer]


def _input_event(schedule, recv: Kind, stage: int, mb: int) -> Event | None:
    """In a lowered schedule, the local receive a compute on ``stage`` waits for (None if its input is local)."""
    producer = stage - 1 if recv is Kind.RECV_F else stage + 1
    if is_lowered(schedule) and _crosses_ranks(schedule, producer, stage):
        return ("RECEIVED", recv, stage, mb)
    return None


def _missing_comm(schedule) -> list[str]:
    """Each cross-rank edge of a lowered schedule needs exactly one SEND and one RECV."""
    counts = Counter(a for _, _, a in schedule.all_actions() if a.kind in COMM_KINDS)
    problems = []
    edges = ((Kind.SEND_F, Kind.RECV_F, 1), (Kind.SEND_B, Kind.RECV_B, -1))  # (send, recv, consumer offset)
    for s in range(schedule.num_stages):
        for send, recv, step in edges:
            t = s + step
            if not 0 <= t < schedule.num_stages or not _crosses_ranks(schedule, s, t):
                continue
            for m in range(schedule.num_microbatches):
                for action in (Action(s, send, m), Action(t, recv, m)):
                    if counts[action] != 1:
                        problems.append(f"lowered schedule has {counts[action]} of {action}, needs 1")
    return problems
