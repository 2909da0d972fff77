"""The measured timeline: every rank's compute spans, gathered to every rank as one ``Timeline``.

Each rank records (action, start, end) of its compute actions with the wall clock (``time.time``, so
spans from several machines line up as well as their clocks do). One fixed-size all-gather per step
brings them together: each rank's action count is known from the schedule, so no sizes are exchanged.
Times are made relative to the earliest start, in seconds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from bubbleless_schedules import Action, Kind, Schedule, Span, Timeline, peak_memory

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
        gathered = [torch.empty_like(mine) for _ in range(schedule.num_ranks)]
        work = dist.all_gather(gathered, mine, group=group, async_op=True)
        wait_collective(work, timeout, "gathering the measured timeline", rank)
    all_spans = [span for worker, rows in enumerate(gathered) for span in decode_spans(worker, rows)]
    origin = min((s.start for s in all_spans), default=0.0)
    shifted = tuple(Span(s.worker, s.action, s.start - origin, s.end - origin) for s in all_spans)
    return Timeline(schedule, shifted, peak_memory(schedule))
