"""Pictures of a round-robin pool's timeline: rows are devices, LOAD/STORE drawn where they can be seen."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs, Kind, generate, simulate
from bubbleless_schedules.trace import trace_events


@pytest.fixture
def pool_timeline():
    """Transfers a thousandth of a compute, as a CPU device's copies are."""
    schedule = generate("roundrobin", num_ranks=2, num_microbatches=3, num_layers=6)
    n = schedule.num_stages
    costs = Costs(1.0, 1.0, 1.0, 0.0, recompute=(1.0,) * n, load=(0.001,) * n, store=(0.001,) * n)
    return simulate(schedule, costs)


def test_trace_names_devices_and_keeps_every_load_and_store(pool_timeline):
    events = trace_events(pool_timeline, time_unit="s")
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {0: "device 0", 1: "device 1"}
    spans = [e for e in events if e["ph"] == "X"]
    for kind in (Kind.LOAD, Kind.STORE, Kind.R):
        want = sum(1 for s in pool_timeline.spans if s.action.kind is kind)
        assert want and sum(1 for e in spans if e["cat"] == kind.value) == want
    assert all(e["dur"] == pytest.approx(1000) for e in spans if e["cat"] in ("LOAD", "STORE"))  # 1 ms in us


def test_png_rows_are_devices_and_transfers_get_a_visible_lane(pool_timeline, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    from bubbleless_schedules.plot import KIND_NAMES, MIN_TRANSFER_PIXELS, plot_timeline

    figure = plot_timeline(pool_timeline, tmp_path / "pool.png", time_unit="s", dpi=100)
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["device 0", "device 1"]
    assert axes.get_xlabel() == "time (s)"
    legend = {t.get_text() for t in axes.get_legend().get_texts()}
    assert {KIND_NAMES[Kind.LOAD], KIND_NAMES[Kind.STORE], KIND_NAMES[Kind.R]} <= legend
    lane = [bar for bar in axes.collections if bar.get_paths()[0].get_extents().height < 0.2 + 1e-9]
    transfers = sum(1 for s in pool_timeline.spans if s.action.kind in (Kind.LOAD, Kind.STORE))
    assert len(lane) == transfers  # every LOAD and STORE in the thin lane under its row's compute
    width_px = figure.get_size_inches()[0] * 0.85 * 100
    for bar in lane:  # 1e-3 of a compute would be under a pixel; each is drawn at least MIN_TRANSFER_PIXELS
        extent = bar.get_paths()[0].get_extents()
        assert extent.width * width_px / pool_timeline.makespan >= MIN_TRANSFER_PIXELS - 1e-6
    assert (tmp_path / "pool.png").stat().st_size > 5000
