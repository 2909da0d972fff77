"""Pictures of timelines: the text timeline's shape, the PNG, and the Perfetto trace."""

from __future__ import annotations

import json
import sys

import pytest

from bubbleless_schedules import Action, Costs, Kind, Schedule, Span, Timeline, generate, simulate
from bubbleless_schedules.timeline_text import IDLE, LEGEND, MAX_BANDS, render_timeline
from bubbleless_schedules.trace import trace_events, write_trace


@pytest.fixture
def timeline():
    return simulate(generate("1f1b", num_ranks=4, num_microbatches=6), Costs(1.0, 2.0, 1.0, 0.25))


def test_text_timeline_of_a_small_schedule():
    """Each action is its label and blanks up to its end; idle is dots; a ruler and the legend below."""
    small = simulate(generate("1f1b", num_ranks=2, num_microbatches=3), Costs(1.0, 1.0, 1.0, 0.0))
    assert render_timeline(small, 48) == (
        "rank 0 F0  F1  ........B0      F2  B1      ....B2      \n"
        "rank 1 ....F0  B0      F1  B1      F2  B2      ........\n"
        "       |         |         |         |         |      |\n"
        "       0         2.5       5         7.5       10    12\n"
        f"{LEGEND}   (1 column = 0.25 time units)"
    )


def test_text_timeline_rows_read_as_the_workers_actions_in_order():
    """Stages shown when a rank holds two (zbv); the words of a row are its actions, nothing run together."""
    zbv = simulate(generate("zbv", num_ranks=4, num_microbatches=6))
    rows = render_timeline(zbv, 200, legend=False).splitlines()[:4]
    assert rows[0].startswith("rank 0 0F0 ") and "7F0" in rows[0]
    for worker, row in enumerate(rows):
        words = row[len("rank 0 "):].replace(IDLE, " ").split()
        assert words == [str(a) for a in zbv.schedule.actions[worker]]


def test_text_timeline_continues_in_bands_of_the_given_width(timeline):
    """Too many actions for the width at a readable scale: full bands of ``width`` columns, a ruler each."""
    lines = render_timeline(timeline, 72).splitlines()
    bands = "\n".join(lines[:-1]).split("\n\n")
    assert len(bands) == 2
    for band in bands:
        rows = band.splitlines()[:4]
        assert [r[:len("rank 0")] for r in rows] == [f"rank {w}" for w in range(4)]
        assert all(len(r) == len("rank 0 ") + 72 for r in rows)
        assert band.splitlines()[4].strip().startswith("|")  # its ruler
    assert bands[0].splitlines()[5].split()[0] == "0" and bands[1].splitlines()[5].split()[-1] == "39"
    assert "1 column =" in lines[-1] and "idle" in lines[-1]
    # the shortest action (F, 1 unit) still has room for its label and a blank
    assert float(lines[-1].split("1 column = ")[1].split()[0]) <= 1.0 / 3


def test_text_timeline_draws_labels_over_spans_and_idle_as_dots(timeline):
    rows = [r[len("rank 0 "):] for r in render_timeline(timeline, 150, legend=False).splitlines()[:4]]
    assert rows[0].startswith("F0 ")  # rank 0 starts at once
    assert rows[3].startswith(IDLE)  # the last rank waits for the first forward to arrive
    for mb in range(6):
        assert all(f"F{mb} " in row and f"B{mb} " in row for row in rows)
    # Idle columns match the simulated idle time of each rank to within rounding of the scale.
    scale = timeline.makespan / 150
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
    assert row == "F0   .....B0        "


def test_text_timeline_of_tiny_actions_keeps_a_letter_for_each():
    """A microsecond beside seconds: past MAX_BANDS the scale coarsens, and the short action stays a letter."""
    schedule = Schedule([[Action(0, Kind.F, 0), Action(0, Kind.B, 0)]], num_stages=1, num_microbatches=1,
                        stage_to_rank=(0,), name="one")
    spans = (Span(0, Action(0, Kind.F, 0), 0.0, 1e-6), Span(0, Action(0, Kind.B, 0), 1.0, 2.0))
    lines = render_timeline(Timeline(schedule, spans, (1.0,)), 10, legend=False).splitlines()
    rows = [line[len("rank 0 "):] for line in lines if line.startswith("rank 0")]
    assert len(rows) == MAX_BANDS
    assert rows[0].startswith("F" + IDLE) and rows[-1].rstrip().endswith("B0")


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


def test_png_legend_names_a_shade_per_chunk_and_the_axis_its_unit():
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from matplotlib.colors import to_rgb

    from bubbleless_schedules.plot import plot_timeline

    zbv = simulate(generate("zbv", num_ranks=2, num_microbatches=4))
    axes = plot_timeline(zbv).axes[0]  # built, not written
    legend = axes.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [f"{kind}, chunk {c}" for kind in ("F forward", "I input-grad", "W weight-grad") for c in (0, 1)]
    down, back = (to_rgb(patch.get_facecolor()) for patch in legend.get_patches()[:2])
    assert sum(back) > sum(down)  # the second chunk (the way back up the V) is the lighter shade
    drawn = {tuple(round(c, 6) for c in to_rgb(bar.get_facecolor()[0])) for bar in axes.collections}
    assert {tuple(round(c, 6) for c in to_rgb(p.get_facecolor())) for p in legend.get_patches()} == drawn
    assert axes.get_xlabel() == "time (cost units)"


def test_png_one_stage_per_rank_has_plain_kind_names(timeline):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from bubbleless_schedules.plot import plot_timeline

    axes = plot_timeline(timeline, time_unit="s").axes[0]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["F forward", "B full backward"]
    assert axes.get_xlabel() == "time (s)" and axes.get_xlim() == (0, timeline.makespan)
    assert f"makespan {timeline.makespan:.4g} s " in axes.get_title()


def test_png_of_a_measured_run_under_a_second_is_in_ms():
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from bubbleless_schedules.plot import plot_timeline

    schedule = Schedule([[Action(0, Kind.F, 0), Action(0, Kind.B, 0)]], num_stages=1, num_microbatches=1,
                        stage_to_rank=(0,), name="one")
    spans = (Span(0, Action(0, Kind.F, 0), 5.0, 5.02), Span(0, Action(0, Kind.B, 0), 5.02, 5.06))
    axes = plot_timeline(Timeline(schedule, spans, (1.0,)), time_unit="s").axes[0]
    assert axes.get_xlabel() == "time (ms)"
    assert axes.get_xlim() == pytest.approx((0, 60.0))
    assert "makespan 60 ms" in axes.get_title()
