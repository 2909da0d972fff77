"""Chrome / Perfetto trace of a timeline: open the JSON in https://ui.perfetto.dev or chrome://tracing.

One process (the schedule), one thread per worker, one complete event (``"ph": "X"``) per action,
with ``ts`` and ``dur`` in microseconds as the trace format requires. The runtime writes measured
timelines through the same functions, so nothing here assumes the timeline was simulated; say what
unit its times are in with ``time_unit``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .simulate import Timeline

MICROSECONDS_PER = {"s": 1e6, "ms": 1e3, "us": 1.0}
"""How many microseconds one unit of the timeline's times is, by unit name."""


def _scale(time_unit: str) -> float:
    try:
        return MICROSECONDS_PER[time_unit]
    except KeyError:
        raise ValueError(f"time_unit must be one of {sorted(MICROSECONDS_PER)}, got {time_unit!r}") from None


def trace_events(timeline: Timeline, *, time_unit: str = "ms", pid: int = 0) -> list[dict]:
    """The trace events: names for the process and each worker's thread, then one "X" event per action.

    ``time_unit``: what one unit of the timeline's times is ("ms" fits profiled costs in
    milliseconds; a runtime timing with ``time.perf_counter`` passes "s"). Times are shifted so the
    first action starts at 0.
    """
    scale = _scale(time_unit)
    schedule = timeline.schedule
    noun = "rank" if schedule.stage_to_rank is not None else "device"
    origin = min((s.start for s in timeline.spans), default=0.0)
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
         "args": {"name": f"schedule {schedule.name or '(unnamed)'}"}},
    ]
    for worker in range(schedule.num_workers):
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": worker,
                       "args": {"name": f"{noun} {worker}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": worker,
                       "args": {"sort_index": worker}})
    for span in sorted(timeline.spans, key=lambda s: (s.worker, s.start)):
        action = span.action
        events.append({
            "name": str(action),
            "cat": action.kind.value,
            "ph": "X",
            "pid": pid,
            "tid": span.worker,
            "ts": (span.start - origin) * scale,
            "dur": (span.end - span.start) * scale,
            "args": {"stage": action.stage, "kind": action.kind.value, "microbatch": action.microbatch},
        })
    return events


def write_trace(timeline: Timeline, path: str | Path, *, time_unit: str = "ms") -> Path:
    """Write the trace JSON to ``path`` (parent folders are created) and return the path."""
    path = Path(path)
    document = {
        "traceEvents": trace_events(timeline, time_unit=time_unit),
        "displayTimeUnit": "ms",
        "otherData": {"time_unit": time_unit, **timeline.summary()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path
