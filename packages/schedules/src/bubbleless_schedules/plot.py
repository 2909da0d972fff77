"""A Gantt chart of a timeline as a PNG (matplotlib is an optional extra).

matplotlib is imported inside the function, never at package import, so the package stays pure
Python; without it ``plot_timeline`` raises ImportError saying which extra to install. The chart uses
matplotlib's object API (``Figure`` with the Agg canvas), not pyplot, so drawing a chart never changes
the caller's global backend or leaks figures.
"""

from __future__ import annotations

from pathlib import Path

from .action import Kind
from .simulate import Timeline

KIND_COLOURS = {
    Kind.F: "#4c72b0",  # blue
    Kind.I: "#dd8452",  # orange
    Kind.W: "#55a868",  # green
    Kind.B: "#c44e52",  # red: I and W fused
    Kind.R: "#8172b3",  # purple
    Kind.LOAD: "#937860",
    Kind.STORE: "#da8bc3",
}
OTHER_COLOUR = "#8c8c8c"
KIND_NAMES = {
    Kind.F: "F forward", Kind.I: "I input-grad", Kind.W: "W weight-grad", Kind.B: "B full backward",
    Kind.R: "R recompute", Kind.LOAD: "LOAD weights in", Kind.STORE: "STORE grads out",
}


def _import_matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(
            "drawing a PNG needs matplotlib: pip install bubbleless-schedules[plot]"
        ) from exc
    return Figure, FigureCanvasAgg, Patch


def _shade(colour: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """Later chunks of a worker (the way back in a V) are drawn lighter, so chunks tell apart."""
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    mix = 0.45 * chunk / max(1, chunks - 1) if chunks > 1 else 0.0
    return tuple(c + (1 - c) * mix for c in rgb)


def chart_title(timeline: Timeline, time_unit: str | None = None) -> str:
    """Name, shape, makespan (in the axis's unit, see ``time_axis``), bubble rates and peak memory."""
    s = timeline.schedule
    factor, label = time_axis(time_unit, timeline.makespan)
    unit = "" if time_unit is None else " " + label[len("time ("):-1]
    return (
        f"{s.name or 'schedule'}  p={s.num_workers} m={s.num_microbatches} stages={s.num_stages}   "
        f"makespan {timeline.makespan * factor:.4g}{unit}   bubble {timeline.bubble_rate:.1%} "
        f"(in-span {timeline.span_bubble_rate:.1%})   peak memory {timeline.max_peak_memory:.3g} M_B"
    )


TRANSFER_KINDS = (Kind.LOAD, Kind.STORE)
"""Drawn in a lane of their own along the bottom of a row, at least ``MIN_TRANSFER_PIXELS`` wide: a
weight upload or gradient download on a CPU device lasts microseconds, and would vanish between
compute boxes (and, once transfers overlap compute on their own streams, would hide under them)."""
MIN_TRANSFER_PIXELS = 2.0


def chunk_of(timeline: Timeline, worker: int, stage: int) -> tuple[int, int]:
    """(chunk, chunks): which of its worker's stages ``stage`` is (0 the first, e.g. the way down a V) and
    how many the worker holds; (0, 1) for a round-robin pool, whose devices hold no stage for good."""
    stages = timeline.schedule.stages_of(worker)
    return (stages.index(stage) if stage in stages else 0), max(1, len(stages))


def legend_entries(timeline: Timeline) -> list[tuple[str, tuple[float, float, float]]]:
    """(label, colour) per shade drawn: a kind's name, with ``, chunk N`` for each chunk when a worker
    holds several stages (the later chunk lighter), in kind then chunk order."""
    used: dict[Kind, set[tuple[int, int]]] = {}
    for span in timeline.spans:
        if span.end > span.start:
            used.setdefault(span.action.kind, set()).add(chunk_of(timeline, span.worker, span.action.stage))
    several = any(chunks > 1 for pairs in used.values() for _, chunks in pairs)
    entries = []
    for kind in sorted(used, key=list(Kind).index):
        name, colour = KIND_NAMES.get(kind, kind.value), KIND_COLOURS.get(kind, OTHER_COLOUR)
        for chunk, chunks in sorted(used[kind]):
            label = f"{name}, chunk {chunk}" if several else name
            entry = (label, _shade(colour, chunk, chunks))
            if entry not in entries:
                entries.append(entry)
    return entries


def time_axis(time_unit: str | None, makespan: float) -> tuple[float, str]:
    """(factor the times are drawn multiplied by, the axis label). None: simulated cost units; ``s``: a
    measured timeline, drawn in ms when it is shorter than a second."""
    if time_unit is None:
        return 1.0, "time (cost units)"
    if time_unit == "s" and makespan < 1.0:
        return 1000.0, "time (ms)"
    return 1.0, f"time ({time_unit})"


def plot_timeline(timeline: Timeline, path: str | Path | None = None, *, dpi: int = 120, title: str | None = None,
                  time_unit: str | None = None):
    """Draw ``timeline`` as a Gantt chart; write a PNG to ``path`` when given. Returns the Figure.

    One row per worker (``rank N`` for stage-bound schedules, ``device N`` for a round-robin pool), one
    box per action coloured by kind with its micro-batch number inside (when the box is wide enough),
    title with makespan, both bubble rates and peak memory. LOAD and STORE go in a thin lane at the
    bottom of their row (see ``TRANSFER_KINDS``). ``time_unit`` is the unit of the spans' times, on the
    axis label ("s" for a measured timeline, drawn in ms under a second; None: "cost units", as
    simulated costs are). The legend names each shade: a kind per chunk when workers hold several
    stages (``legend_entries``).
    """
    Figure, FigureCanvasAgg, Patch = _import_matplotlib()
    schedule = timeline.schedule
    workers = schedule.num_workers
    timed = [s for s in timeline.spans if s.end > s.start]
    origin = min((s.start for s in timed), default=0.0)
    makespan = max((s.end for s in timed), default=1.0) - origin or 1.0
    factor, axis_label = time_axis(time_unit, makespan)
    makespan *= factor

    width_inches = min(40.0, max(8.0, 0.12 * max((len(r) for r in schedule.actions), default=1)))
    figure = Figure(figsize=(width_inches, 0.5 * workers + 1.6), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    # Roughly how many characters fit in one time unit, to decide which boxes get a number.
    chars_per_unit = width_inches * 0.85 * 72 / 7 / makespan
    min_transfer = MIN_TRANSFER_PIXELS * makespan / (width_inches * 0.85 * dpi)
    lane = any(s.action.kind in TRANSFER_KINDS for s in timed)  # compute boxes leave the lane free
    compute_height = 0.6 if lane else 0.8
    for span in sorted(timed, key=lambda s: s.action.kind in TRANSFER_KINDS):  # transfers drawn last
        action = span.action
        chunk, chunks = chunk_of(timeline, span.worker, action.stage)
        colour = _shade(KIND_COLOURS.get(action.kind, OTHER_COLOUR), chunk, chunks)
        left, length = (span.start - origin) * factor, (span.end - span.start) * factor
        if action.kind in TRANSFER_KINDS:
            axes.broken_barh([(left, max(length, min_transfer))], (span.worker + 0.22, 0.18), facecolors=[colour],
                             edgecolors="none")
            continue
        axes.broken_barh([(left, length)], (span.worker - 0.4, compute_height), facecolors=[colour],
                         edgecolors="white", linewidth=0.5)
        label = "" if action.microbatch is None else str(action.microbatch)
        if label and length * chars_per_unit >= len(label) + 0.5:
            axes.text(left + length / 2, span.worker - 0.4 + compute_height / 2, label, ha="center", va="center",
                      fontsize=7, color="white")
    axes.set_ylim(workers - 0.5, -0.5)
    axes.set_xlim(0, makespan)
    noun = "rank" if schedule.stage_to_rank is not None else "device"
    axes.set_yticks(range(workers))
    axes.set_yticklabels([f"{noun} {w}" for w in range(workers)])
    axes.set_xlabel(axis_label)
    axes.set_title(title or chart_title(timeline, time_unit), fontsize=9)
    handles = [Patch(facecolor=colour, label=label) for label, colour in legend_entries(timeline)]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    figure.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=dpi)
    return figure
