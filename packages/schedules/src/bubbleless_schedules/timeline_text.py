"""A timeline drawn in text, for the terminal: one row per worker, time along the line.

Every action covers the columns of its span and shows its label there (``F3`` for a forward of
micro-batch 3; ``2F3`` when a worker holds several stages, so the chunk stays visible); idle time is
``.``. Time is scaled so the whole makespan fills ``width`` columns, which makes short actions lose
their label: they still cover at least one column (the kind letter) whenever that column would
otherwise be idle, so no action disappears. Works for simulated and measured timelines alike; actions
that take no time (lowered sends and receives) are not drawn.
"""

from __future__ import annotations

from .action import Action
from .simulate import Timeline

IDLE = "."
LEGEND = "F forward   I input-grad backward   W weight-grad backward   B full backward   R recompute   . idle"


def action_label(action: Action, stages_per_worker: float) -> str:
    """The text drawn over an action: the stage is left out when each worker holds one stage."""
    if stages_per_worker == 1 and action.microbatch is not None:
        return f"{action.kind.value}{action.microbatch}"
    return str(action)


def _columns(start: float, end: float, origin: float, scale: float, width: int) -> tuple[int, int]:
    first = min(width - 1, int(round((start - origin) / scale)))
    last = min(width, int(round((end - origin) / scale)))
    return first, last


def _paint_row(timeline: Timeline, worker: int, origin: float, scale: float, width: int) -> str:
    cells = [IDLE] * width
    per_worker = timeline.schedule.stages_per_rank if timeline.schedule.stage_to_rank is not None else 0
    for span in timeline.per_worker[worker]:
        if span.end <= span.start:
            continue
        first, last = _columns(span.start, span.end, origin, scale, width)
        label = action_label(span.action, per_worker)
        if last <= first:  # shorter than a column: keep a trace of it where nothing else is drawn
            if cells[first] == IDLE:
                cells[first] = span.action.kind.value[0]
            continue
        length = last - first
        text = label if len(label) <= length else span.action.kind.value[:length]
        # Pad with the kind's letter in lower case so a long span reads as one action, not as idle.
        cells[first:last] = list(text + span.action.kind.value[0].lower() * (length - len(text)))
    return "".join(cells)


def _axis(makespan: float, label_width: int, width: int) -> str:
    """A ruler under the rows: a tick every few columns with its time, and the makespan at the end."""
    ticks = [" "] * width
    numbers = [" "] * width
    end_text = f"{makespan:.4g}"
    step = max(10, width // 8)
    for column in range(0, width, step):
        ticks[column] = "|"
        text = f"{makespan * column / width:.4g}"
        if column + len(text) < width - len(end_text) - 1:  # never run into the makespan label
            numbers[column:column + len(text)] = list(text)
    ticks[width - 1] = "|"
    numbers[width - len(end_text):] = list(end_text)
    pad = " " * (label_width + 1)
    return f"{pad}{''.join(ticks)}\n{pad}{''.join(numbers).rstrip()}"


def render_timeline(timeline: Timeline, width: int = 100, *, legend: bool = True) -> str:
    """The timeline as text lines: one row per worker, ``width`` columns for the whole makespan.

    Below the rows come a time ruler and, unless ``legend=False``, the legend with the time one
    column stands for.
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
    scale = makespan / width
    rows = [
        f"{label:<{label_width}} {_paint_row(timeline, w, origin, scale, width)}" for w, label in enumerate(labels)
    ]
    rows.append(_axis(makespan, label_width, width))
    if legend:
        rows.append(f"{LEGEND}   (1 column = {scale:.3g} time units)")
    return "\n".join(rows)
