"""Pictures of timelines: the text timeline's shape, the PNG, and the Perfetto trace."""

from __future__ import annotations

import json
import sys

import pytest

from bubbleless_schedules import Action, Costs, Kind, Schedule, Span, Timeline, generate, simulate
from bubbleless_schedules.timeline_text import IDLE, render_timeline
from bubbleless_schedules.trace import trace_events, write_trace


@pytest.fixture
def timeline():
    return simulate(generate("1f1b", num_ranks=4, num_microbatches=6), Costs(1.0, 2.0, 1.0, 0.25))


def test_text_timeline_has_one_row_per_worker_of_the_given_width(timeline):
    lines = render_timeline(timeline, 72).splitlines()
    rows = lines[:4]
    assert [r.split()[0] + " " + r.split()[1] for r in rows] == [f"rank {w}" for w in range(4)]
    assert all(len(r) == len("rank 0 ") + 72 for r in rows)
    assert "1 column =" in lines[-1] and "idle" in lines[-1]
    assert len(lines) == 4 + 2 + 1  # rows, ruler (ticks and times), legend


def test_text_timeline_draws_labels_over_spans_and_idle_as_dots(timeline):
    rows = [r[len("rank 0 "):] for r in render_timeline(timeline, 120, legend=False).splitlines()[:4]]
    assert rows[0].startswith("F0")  # rank 0 starts at once
    assert rows[3].startswith(IDLE)  # the last rank waits for the first forward to arrive
    for mb in range(6):
        assert all(f"F{mb}" in row and f"B{mb}" in row for row in rows)
    # Idle columns match the simulated idle time of each rank to within rounding of the scale.
    scale = timeline.makespan / 120
    for w, row in enumerate(rows):
        idle = timeline.makespan - timeline.busy(w)
        assert abs(row.count(IDLE) * scale - idle) <= 2 * scale * (1 + len(timeline.per_worker[w]) / 4)


def test_text_timeline_of_a_measured_timeline_with_an_offset():
    """A measured timeline starts wherever the clock was; the drawing starts at its first action."""
    schedule = Schedule([[Action(0, Kind.F, 0), Action(0, Kind.B, 0)]], num_stages=1, num_microbatches=1,
                        stage_to_rank=(0,), name="one")
    spans = (Span(0, Action(0, Kind.F, 0), 1000.0, 1001.0), Span(0, Action(0, Kind.B, 0), 1002.0, 1004.0))
    measured = Timeline(schedule, spans, (1.0,))
    row = render_timeline(measured, 20, legend=False).splitlines()[0][len("rank 0 "):]
    assert row == "F0fff.....B0bbbbbbbb"


def test_text_timeline_refuses_a_tiny_width(timeline):
    with pytest.raises(ValueError, match="at least 10 columns"):
        render_timeline(timeline, 5)


def test_trace_has_one_complete_event_per_action_in_microseconds(timeline, tmp_path):
    path = write_trace(timeline, tmp_path / "deep" / "t.json")
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline.spans) == sum(len(r) for r in timeline.schedule.actions)
    assert {e["pid"] for e in events} == {0}
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {w: f"rank {w}" for w in range(4)}
    by_name = {(e["tid"], e["name"]): e for e in complete}
    for span in timeline.spans:
        event = by_name[(span.worker, str(span.action))]
        assert event["ts"] == pytest.approx(span.start * 1000)  # costs read as ms, trace in us
        assert event["dur"] == pytest.approx((span.end - span.start) * 1000)
        assert event["cat"] == span.action.kind.value
    assert document["otherData"]["makespan"] == timeline.makespan


def test_trace_time_units(timeline):
    seconds = [e for e in trace_events(timeline, time_unit="s") if e["ph"] == "X"]
    micro = [e for e in trace_events(timeline, time_unit="us") if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in seconds) == pytest.approx(timeline.makespan * 1e6)
    assert max(e["ts"] + e["dur"] for e in micro) == pytest.approx(timeline.makespan)
    with pytest.raises(ValueError, match="time_unit must be one of"):
        trace_events(timeline, time_unit="fortnight")


def test_png_is_written(timeline, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from bubbleless_schedules.plot import chart_title, plot_timeline

    path = tmp_path / "sub" / "chart.png"
    figure = plot_timeline(timeline, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert figure.axes[0].get_title() == chart_title(timeline)
    assert "makespan" in chart_title(timeline) and "peak memory 4 M_B" in chart_title(timeline)
    numbers = {t.get_text() for t in figure.axes[0].texts}
    assert numbers == {str(mb) for mb in range(6)}


def test_png_without_matplotlib_says_which_extra(timeline, monkeypatch, tmp_path):
    from bubbleless_schedules.plot import plot_timeline

    for module in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib...` fail
    with pytest.raises(ImportError, match=r"pip install bubbleless-schedules\[plot\]"):
        plot_timeline(timeline, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_importing_the_package_does_not_import_matplotlib():
    import subprocess

    code = "import sys, bubbleless_schedules.plot, bubbleless_schedules.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
