"""The measured timeline: every rank's compute spans, gathered to every rank as one ``Timeline``.

Each rank records (action, start, end) of its compute actions with the wall clock (``time.time``, so
spans from several machines line up as well as their clocks do). One fixed-size all-gather brings a
step's spans together, only when someone asks for the timeline (``Pipeline.last_timeline``): each
rank's action count is known from the schedule, so no sizes are exchanged.
Times are made relative to the earliest start, in seconds.

A span holds all the work of its action, posting transfers and bookkeeping included, and leaves out
only the time its rank was blocked waiting for a peer (``Executor.run``). So the gaps of a measured
timeline are exactly the waits the simulator models, and ``calibrated_costs`` turns one measured step
into simulator ``Costs``: the mean duration of each kind of action per stage (the sum of busy time is
kept) and, as ``comm``, the median delay from a producer's end to the start of a consumer on another
rank that had to wait for it (what the simulator adds to every cross-rank dependency).
"""

from __future__ import annotations

from statistics import mean, median

import torch
import torch.distributed as dist

from bubbleless_schedules import Action, Costs, Kind, Schedule, Span, Timeline, peak_memory
from bubbleless_schedules.layouts import layout_of

from .collectives import backend_device
from .comm import wait_collective

_KINDS = list(Kind)


def encode_spans(spans, length: int) -> torch.Tensor:
    rows = [[a.stage, _KINDS.index(a.kind), a.microbatch, start, end] for a, start, end in spans]
    rows += [[-1, -1, -1, 0.0, 0.0]] * (length - len(rows))
    return torch.tensor(rows, dtype=torch.float64).reshape(length, 5)


def decode_spans(worker: int, rows: torch.Tensor) -> list[Span]:
    return [
        Span(worker, Action(int(s), _KINDS[int(k)], int(m)), float(start), float(end))
        for s, k, m, start, end in rows.tolist()
        if s >= 0
    ]


def measured_timeline(schedule: Schedule, spans, *, distributed: bool, group, rank: int, timeout: float) -> Timeline:
    """Gather this step's spans from every rank of ``group`` (collective: every rank calls it).
    ``group`` None is the default group; ``distributed`` False means a single process."""
    length = max(len(row) for row in schedule.actions)
    mine = encode_spans(spans, length)
    if not distributed:
        gathered = [mine]
    else:
        mine = mine.to(backend_device(group))
        gathered = [torch.empty_like(mine) for _ in range(schedule.num_ranks)]
        work = dist.all_gather(gathered, mine, group=group, async_op=True)
        wait_collective(work, timeout, "gathering the measured timeline", rank)
        gathered = [rows.cpu() for rows in gathered]
    all_spans = [span for worker, rows in enumerate(gathered) for span in decode_spans(worker, rows)]
    origin = min((s.start for s in all_spans), default=0.0)
    shifted = tuple(Span(s.worker, s.action, s.start - origin, s.end - origin) for s in all_spans)
    return Timeline(schedule, shifted, peak_memory(schedule))


def transfer_latencies(timeline: Timeline) -> list[float]:
    """Seconds from the end of a compute on one rank to the start of its consumer on another rank, for
    every consumer that had to wait for it (it starts later than its rank's previous action ended).

    A consumer that did not wait says nothing about the transfer (the data was there before it was
    needed), and a rank's first action is left out because the time it joined the step is unknown.
    """
    schedule = timeline.schedule
    layout = layout_of(schedule)
    made_by = {event: span for span in timeline.spans for event in layout.produces(span.action, schedule)}
    latencies = []
    for row in timeline.per_worker:
        for previous, span in zip(row, row[1:], strict=False):
            if span.start <= previous.end:
                continue
            for event in layout.requires(span.action, schedule):
                producer = made_by.get(event)
                if producer is not None and producer.worker != span.worker:
                    latencies.append(span.start - producer.end)
    return latencies


_COST_SHARES = {  # kind -> (Costs field, share of the span); a fused B counts half as I, half as W
    Kind.F: (("forward", 1.0),),
    Kind.I: (("backward_input", 1.0),),
    Kind.W: (("backward_weight", 1.0),),
    Kind.B: (("backward_input", 0.5), ("backward_weight", 0.5)),
    Kind.R: (("recompute", 1.0),),  # the round-robin pool's actions
    Kind.LOAD: (("load", 1.0),),
    Kind.STORE: (("store", 1.0),),
}


def calibrated_costs(timeline: Timeline) -> Costs:
    """Simulator ``Costs`` (seconds) from a measured timeline: per-stage mean F, I and W durations and
    the median transfer latency as ``comm`` (0 when no consumer waited).

    Means, not medians, so the simulated busy time equals the measured one and the two bubble rates
    differ only by where the time goes. A fused B is split evenly between I and W, which leaves the
    simulated B cost (I + W) unchanged.
    """
    durations: dict[tuple[str, int], list[float]] = {}
    for span in timeline.spans:
        for name, share in _COST_SHARES.get(span.action.kind, ()):
            durations.setdefault((name, span.action.stage), []).append((span.end - span.start) * share)

    def per_stage(name: str) -> tuple[float, ...]:
        return tuple(mean(durations.get((name, s), [0.0])) for s in range(timeline.schedule.num_stages))

    latencies = transfer_latencies(timeline)
    comm = max(0.0, median(latencies)) if latencies else 0.0
    kinds = {span.action.kind for span in timeline.spans}
    pool = {}
    if Kind.R in kinds or Kind.LOAD in kinds:  # round-robin: per-job recompute and transfers too
        pool = {"recompute": per_stage("recompute"), "load": per_stage("load"), "store": per_stage("store")}
    return Costs(per_stage("forward"), per_stage("backward_input"), per_stage("backward_weight"), comm, **pool)
