"""A timeline drawn in text, for the terminal: one row per worker, time along the line.

Every action covers the columns of its span and starts with its label (``F3`` for a forward of
micro-batch 3; ``2F3`` when a worker holds several stages, so the chunk stays visible), the rest of its
columns blank, so a row reads as actions: ``0F0 0F1 0F2 7F0 7I0 7W0``. Idle time is ``.``.

The time scale is chosen so the shortest compute action still fits its label and a blank (and the
whole makespan fills at least ``width`` columns); when that needs more than ``width`` columns the
timeline continues in bands of ``width`` columns, each with its own ruler, at most ``MAX_BANDS`` of
them. Past that the scale is coarsened: an action too short for its label shows its kind letter and,
shorter than a column, keeps that letter where nothing else is drawn, so no action disappears. Works
for simulated and measured timelines alike; actions that take no time (lowered sends and receives)
are not drawn.
"""

from __future__ import annotations

import math

from .action import Action, Kind
from .simulate import Span, Timeline

IDLE = "."
LEGEND = "F forward   I input-grad backward   W weight-grad backward   B full backward   R recompute   . idle"
MAX_BANDS = 8
"""Bands of ``width`` columns a timeline may take before the scale coarsens (short labels shrink)."""
TRANSFER_KINDS = (Kind.LOAD, Kind.STORE)
"""Too short to set the scale by (a CPU device's copies last microseconds): drawn as a letter."""


def action_label(action: Action, stages_per_worker: float) -> str:
    """The text drawn over an action: the stage is left out when each worker holds one stage."""
    if stages_per_worker == 1 and action.microbatch is not None:
        return f"{action.kind.value}{action.microbatch}"
    return str(action)


def _columns(start: float, end: float, origin: float, scale: float, total: int) -> tuple[int, int]:
    first = min(total - 1, int(round((start - origin) / scale)))
    last = min(total, int(round((end - origin) / scale)))
    return first, last


def _cell(label: str, kind: str, length: int) -> str:
    """``length`` columns for one action: its label and a blank to part it from the next action; the
    kind letter when the label does not fit; the first letter alone in a single column."""
    if length == 1:
        return kind[0]
    text = label if len(label) < length else kind[: length - 1]
    return text + " " * (length - len(text))


def _paint_band(timeline: Timeline, worker: int, origin: float, scale: float, total: int, band: range) -> str:
    """The columns ``band`` of a worker's row. An action cut by the band's edge is drawn in each band as
    if it were whole there: its label where it starts, and again where it continues when it fits."""
    cells = [IDLE] * len(band)
    per_worker = timeline.schedule.stages_per_rank if timeline.schedule.stage_to_rank is not None else 0
    for span in timeline.per_worker[worker]:
        if span.end <= span.start:
            continue
        first, last = _columns(span.start, span.end, origin, scale, total)
        kind = span.action.kind.value
        if last <= first:  # shorter than a column: keep a trace of it where nothing else is drawn
            if first in band and cells[first - band.start] == IDLE:
                cells[first - band.start] = kind[0]
            continue
        lo, hi = max(first, band.start), min(last, band.stop)
        if lo >= hi:
            continue
        label = action_label(span.action, per_worker)
        if lo == first:
            text = _cell(label, kind, hi - lo)
        else:  # the tail of an action begun in the band before
            text = (label if len(label) < hi - lo else "").ljust(hi - lo)
        cells[lo - band.start:hi - band.start] = list(text)
    return "".join(cells)


def _axis(first_column: int, columns: int, scale: float, label_width: int, end_time: float | None) -> str:
    """A ruler under a band: a tick every few columns with its time; the last band ends on the makespan."""
    ticks = [" "] * columns
    numbers = [" "] * columns
    end_text = "" if end_time is None else f"{end_time:.4g}"
    step = max(10, columns // 8)
    for column in range(0, columns - 2 if end_text else columns, step):  # not against the end tick
        ticks[column] = "|"
        text = f"{(first_column + column) * scale:.4g}"
        if column + len(text) < columns - len(end_text) - 1:  # never run into the makespan label
            numbers[column:column + len(text)] = list(text)
    if end_text:
        ticks[columns - 1] = "|"
        numbers[columns - len(end_text):] = list(end_text)
    pad = " " * (label_width + 1)
    return f"{pad}{''.join(ticks)}\n{pad}{''.join(numbers).rstrip()}"


def time_per_column(timeline: Timeline, width: int, timed: list[Span]) -> float:
    """Time per column: the whole makespan over a whole number of bands of ``width`` columns, the fewest
    (at most ``MAX_BANDS``) that give the shortest compute action room for its label and a blank (with
    half a column to spare for rounding)."""
    origin = min(s.start for s in timed)
    makespan = max(s.end for s in timed) - origin
    per_worker = timeline.schedule.stages_per_rank if timeline.schedule.stage_to_rank is not None else 0
    compute = [s for s in timed if s.action.kind not in TRANSFER_KINDS] or timed
    shortest = min(s.end - s.start for s in compute)
    label = max(len(action_label(s.action, per_worker)) for s in compute)
    fit = shortest / (label + 1.5)
    bands = min(MAX_BANDS, max(1, math.ceil(makespan / fit / width - 1e-9)))
    return makespan / (bands * width)  # every band full: no last band of a few columns


def render_timeline(timeline: Timeline, width: int = 100, *, legend: bool = True) -> str:
    """The timeline as text lines: one row per worker in bands of ``width`` columns (see the module).

    Below each band comes a time ruler; after the last, unless ``legend=False``, the legend with the
    time one column stands for.
    """
    if width < 10:
        raise ValueError(f"a text timeline needs at least 10 columns, got width={width}")
    schedule = timeline.schedule
    noun = "rank" if schedule.stage_to_rank is not None else "device"
    labels = [f"{noun} {w}" for w in range(schedule.num_workers)]
    label_width = max((len(x) for x in labels), default=0)
    timed = [s for s in timeline.spans if s.end > s.start]
    if not timed:
        rows = [f"{label:<{label_width}} {IDLE * width}" for label in labels]
        return "\n".join(rows + ["(no action takes any time)"])
    origin = min(s.start for s in timed)
    makespan = max(s.end for s in timed) - origin
    scale = time_per_column(timeline, width, timed)
    total = max(1, round(makespan / scale))
    lines: list[str] = []
    for first in range(0, total, width):
        if first:
            lines.append("")
        columns = min(width, total - first)
        band = range(first, first + columns)
        lines += [f"{label:<{label_width}} {_paint_band(timeline, w, origin, scale, total, band)}"
                  for w, label in enumerate(labels)]
        lines.append(_axis(first, columns, scale, label_width, makespan if first + columns >= total else None))
    if legend:
        lines.append(f"{LEGEND}   (1 column = {scale:.3g} time units)")
    return "\n".join(lines)
