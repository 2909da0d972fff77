"""The event simulator: when every action starts and ends, and what it costs in time and memory.

Each worker runs its actions in order; an action starts when its worker is free and every event it
requires has happened (events from another worker arrive ``costs.comm`` later). Workers never wait for
anything else, so the timeline is exact for the given costs. A worker whose next action waits for an
event that nothing will ever produce is deadlocked; ``simulate`` then raises ``ValueError`` with the
schedule rendered and the stuck actions marked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import accumulate

from .action import Action
from .costs import Costs
from .layouts import layout_of
from .schedule import Schedule


@dataclass(frozen=True, slots=True)
class Span:
    """One action on the timeline."""

    worker: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """The simulated (or measured) run of a schedule."""

    schedule: Schedule
    spans: tuple[Span, ...]
    peak_memory: tuple[float, ...]
    """Per worker: the highest activation memory held at once, in M_B."""
    costs: Costs | None = None
    per_worker: tuple[tuple[Span, ...], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rows: list[list[Span]] = [[] for _ in range(self.schedule.num_workers)]
        for span in self.spans:
            rows[span.worker].append(span)
        object.__setattr__(self, "per_worker", tuple(tuple(sorted(r, key=lambda s: s.start)) for r in rows))

    @property
    def makespan(self) -> float:
        if not self.spans:
            return 0.0
        return max(s.end for s in self.spans) - min(s.start for s in self.spans)

    def busy(self, worker: int) -> float:
        return sum(s.end - s.start for s in self.per_worker[worker])

    def span_of(self, worker: int) -> float:
        row = self.per_worker[worker]
        return row[-1].end - row[0].start if row else 0.0

    @property
    def bubble_rate(self) -> float:
        """Idle share of the whole makespan over all workers (1F1B: (p-1)/(m+p-1) at unit costs)."""
        total = self.makespan * self.schedule.num_workers
        return 0.0 if total <= 0 else 1.0 - sum(self.busy(w) for w in range(self.schedule.num_workers)) / total

    @property
    def span_bubble_rate(self) -> float:
        """Idle share inside a worker's own span (its first start to its last end), for the worst worker.

        This is the zero-bubble papers' (cost - m(F+B+W)) / cost with cost the longest rank span: with
        their 1.5B profile and W keeping 40% of the activations (input_grad_frees=0.6), ``zb`` at 2p gives
        .0446 at m=24 and .0037 at m=32 against their published .0433 and .0039.
        """
        rates = [
            1.0 - self.busy(w) / self.span_of(w)
            for w in range(self.schedule.num_workers)
            if self.span_of(w) > 0
        ]
        return max(rates, default=0.0)

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory, default=0.0)

    def summary(self) -> dict:
        return {
            "name": self.schedule.name,
            "makespan": self.makespan,
            "bubble_rate": self.bubble_rate,
            "span_bubble_rate": self.span_bubble_rate,
            "peak_memory": self.max_peak_memory,
        }


def peak_memory(schedule: Schedule, input_grad_frees: float = 0.0) -> tuple[float, ...]:
    """Per worker, the highest activation memory (in M_B) its action order ever holds."""
    layout = layout_of(schedule)
    peaks = []
    for row in _memory_rows(layout, schedule, input_grad_frees):
        # held after each action, summed left to right from 0 as a plain loop would; 0 counts as a peak
        peaks.append(round(max(accumulate(row, initial=0.0)), 9))
    return tuple(peaks)


def _memory_rows(layout, schedule: Schedule, input_grad_frees: float) -> list[list[float]]:
    """Each action's memory delta, row by row: the layout's whole-schedule answer where it has one
    (``memory_rows``, one lookup per action instead of a method call), else ``memory_delta`` per action."""
    rows = getattr(layout, "memory_rows", None)
    if rows is not None:
        return rows(schedule, input_grad_frees)
    return [[layout.memory_delta(a, schedule, input_grad_frees) for a in row] for row in schedule.actions]


def action_rules(layout, schedule: Schedule, costs: Costs) -> tuple[list, list, list]:
    """(requires, produces, durations): one entry per action, row by row, as the layout's per-action
    methods answer. A layout may answer for the whole schedule at once (``rule_rows``), which saves the
    method calls that dominate simulating a large schedule; ``simulate`` and ``validate`` ask here."""
    rows = getattr(layout, "rule_rows", None)
    if rows is not None:
        return rows(schedule, costs)
    workers = schedule.actions
    requires = [[layout.requires(a, schedule) for a in row] for row in workers]
    durations = [[layout.cost(a, schedule, costs) for a in row] for row in workers]
    return requires, [[layout.produces(a, schedule) for a in row] for row in workers], durations


def simulate(schedule: Schedule, costs: Costs | None = None, *, input_grad_frees: float = 0.0) -> Timeline:
    """Run ``schedule`` under ``costs`` (unit costs by default) and return its ``Timeline``.

    ``input_grad_frees``: the fraction of a micro-batch's activations that I frees (W frees the rest).
    """
    if not 0.0 <= input_grad_frees <= 1.0:
        raise ValueError(f"input_grad_frees must be within [0, 1], got {input_grad_frees}")
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    require_complete(schedule, "simulate")
    runs = run_order(schedule, costs)
    workers = schedule.actions
    spans = tuple([Span(w, workers[w][i], start, end) for w, i, start, end in runs])
    return Timeline(schedule, spans, peak_memory(schedule, input_grad_frees), costs)


def simulated_makespan(schedule: Schedule, costs: Costs | None = None) -> float:
    """``simulate(schedule, costs).makespan`` without building the timeline's spans (half the time on a
    large schedule), for a caller that only compares makespans, as ``auto`` does with its candidates."""
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    require_complete(schedule, "simulate")
    runs = run_order(schedule, costs)
    if not runs:
        return 0.0
    return max(end for _, _, _, end in runs) - min(start for _, _, start, _ in runs)


def run_order(schedule: Schedule, costs: Costs) -> list[tuple[int, int, float, float]]:
    """The event loop behind ``simulate``: (worker, position, start, end) of every action, in the order
    the loop runs them. Raises ``ValueError`` on a deadlock or an event produced twice. ``validate`` calls
    this alone, since it needs neither spans nor memory."""
    if schedule.layout == "pipeline":
        costs.check_stages(schedule.num_stages)
    layout = layout_of(schedule)
    workers = schedule.actions
    requires, produces, durations = action_rules(layout, schedule, costs)
    comm = costs.comm

    happened: dict[tuple, tuple[float, int]] = {}  # event -> (time, worker that produced it)
    waiting: dict[tuple, list[int]] = defaultdict(list)  # event -> workers blocked on it
    position = [0] * len(workers)
    free_at = [0.0] * len(workers)
    runs: list[tuple[int, int, float, float]] = []
    ready = list(range(len(workers)))

    seen_at, record, claim = happened.get, runs.append, happened.setdefault
    while ready:
        worker = ready.pop()
        needs, makes, takes = requires[worker], produces[worker], durations[worker]
        i, free, length = position[worker], free_at[worker], len(needs)
        while i < length:
            start = free
            for event in needs[i]:
                seen = seen_at(event)
                if seen is None:
                    waiting[event].append(worker)
                    break
                at, by = seen
                if by != worker:
                    at += comm
                if at > start:  # start = max(start, arrival), without the call
                    start = at
            else:
                free = start + takes[i]
                record((worker, i, start, free))
                for event in makes[i]:
                    entry = (free, worker)
                    if claim(event, entry) is not entry:  # one lookup: set it unless it happened already
                        message = f"{workers[worker][i]} produces {event} a second time"
                        raise ValueError(_render_error(schedule, [(worker, i)], message))
                    if waiting:
                        ready.extend(waiting.pop(event, ()))
                i += 1
                continue
            break
        position[worker], free_at[worker] = i, free

    stuck = [(w, position[w]) for w in range(len(workers)) if position[w] < len(workers[w])]
    if stuck:
        detail = "; ".join(
            f"worker {w} waits at {workers[w][i]} for {_first_missing(requires[w][i], happened)}" for w, i in stuck
        )
        raise ValueError(_render_error(schedule, stuck, f"deadlock: {detail}"))
    return runs


def check_costs(costs) -> None:
    """ValueError unless ``costs`` is a ``Costs`` (a tuple's order of fields would be a guess)."""
    if not isinstance(costs, Costs):
        raise ValueError(
            f"costs must be a bubbleless_schedules.Costs, got {type(costs).__name__} {costs!r}; pass "
            f"Costs(forward, backward_input, backward_weight, comm), e.g. Costs(1.0, 1.0, 1.0)"
        )


def require_complete(schedule: Schedule, caller: str) -> None:
    """ValueError naming the missing actions when a stage or micro-batch lacks what its layout needs: a
    makespan of part of a schedule would be a silent wrong answer."""
    problems = layout_of(schedule).missing(schedule)
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise ValueError(_render_error(
            schedule, [], f"incomplete schedule ({caller} needs every action; add the missing ones):\n  {shown}"
        ))


def _first_missing(events, happened) -> str:
    for event in events:
        if event not in happened:
            return "(" + ", ".join(str(x) for x in event) + ")"
    return "nothing"


def _render_error(schedule: Schedule, marks, message: str) -> str:
    title = schedule.name or "schedule"
    return f"{title}: {message}\n{schedule.render(mark=marks, width=24)}"
