"""bench/measured/sweep.py: zbv against torch 1F1B over several micro-batch counts. The verdict needs every
half (>= 1.1x, the same peak RSS and held bytes, equal losses) and never reads 'met' on a half not
measured; a count the scenario cannot run is refused before anything runs, one that fails later costs only
its own row; the simulated column follows 1F1B's bubble as m grows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured import runner, sweep  # noqa: E402
from bench.measured.report import simulated_ratio  # noqa: E402
from bench.measured.scenario import Scenario, TinyShape  # noqa: E402

SMALL = Scenario(name="test", model=TinyShape(layers=2, hidden=32, heads=2, intermediate=64, vocab=128),
                 seq_len=16, global_batch=8, microbatches=4, steps=2, warmup=1, rounds=2,
                 systems=("zbv", "zbv-mem", "1f1b"))


def _merged(tokens_per_s: list[float], rss_mib: float) -> dict:
    runs = []
    for index, value in enumerate(tokens_per_s):
        step_s = SMALL.tokens_per_step / value
        runs.append({"times": [step_s, step_s], "losses": [3.0, 2.0], "peak_growth_bytes": int(rss_mib * 2**20),
                     "processes": 2, "threads": 1, "round": index})
    return runner.merge(SMALL, runs)


def _row(zbv: tuple[list[float], float], zbv_mem: tuple[list[float], float]) -> dict:
    systems = {"zbv": _merged(*zbv), "zbv-mem": _merged(*zbv_mem), "1f1b": _merged([1000.0, 2000.0], 100)}
    return {"microbatches": 4, "micro_batch": 2, "simulated_unit": 1.2, "losses_equal": True, "systems": systems,
            "cut": {"sizes": [1, 1, 1, 1], "predicted_ms": 80.0, "baseline_ms": 100.0}}


def test_cross_bench_sweep_meets_the_goal_only_when_faster_and_as_lean():
    row = _row(zbv=([1200.0, 2400.0], 110), zbv_mem=([1200.0, 2400.0], 104))
    (line,) = sweep.table([row])[2:]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == "1.20x (1.20-1.20), RSS 1.10x: NOT met (RSS 1.100x > 1.05x)"  # fast enough, 10% more memory
    assert cells[5] == "1.20x (1.20-1.20), RSS 1.04x: not judged (held bytes not measured)"
    assert cells[3] == "1.25x on [1, 1, 1, 1]" and cells[6] == "-"  # no bubbleless-1f1b in this row
    row["memory"] = {"systems": {name: {"ranks": [{"malloc_peak_growth": a}, {"malloc_peak_growth": b}]}
                                 for name, a, b in (("zbv", 90, 100), ("zbv-mem", 120, 30), ("1f1b", 100, 50))}}
    cells = [c.strip() for c in sweep.table([row])[2].strip("|").split("|")]
    assert cells[4] == "1.20x (1.20-1.20), RSS 1.10x, held 1.00x: NOT met (RSS 1.100x > 1.05x)"
    assert cells[5] == "1.20x (1.20-1.20), RSS 1.04x, held 1.20x: NOT met (held 1.200x > 1.05x)"  # busiest rank against busiest
    row["memory"]["systems"]["zbv-mem"]["ranks"][0]["malloc_peak_growth"] = 104
    assert "RSS 1.04x, held 1.04x: met (longest sequence not searched)" in sweep.table([row])[2]
    row["losses_equal"] = False
    assert "held 1.04x: NOT met (losses differ)" in sweep.table([row])[2]
    row["memory"]["systems"]["1f1b"]["ranks"] = [{"malloc_peak_growth": 0}]  # no mallinfo2: held unknown
    row["losses_equal"] = True
    assert "RSS 1.04x: not judged (held bytes not measured)" in sweep.table([row])[2]
    row["systems"]["1f1b"]["peak_growth_bytes"] = 0  # RSS not measured either: no verdict, no division
    assert sweep.table([row])[2].split("|")[6].strip() == "-"
    slow = _row(zbv=([1050.0, 2100.0], 100), zbv_mem=([1000.0, 2000.0], 90))
    (line,) = sweep.table([slow])[2:]
    assert "1.05x (1.05-1.05), RSS 1.00x: NOT met (1.050x < 1.1x)" in line


def test_cross_bench_sweep_refuses_counts_the_scenario_cannot_run_before_running():
    assert sweep.parse_counts("2,4,8") == (2, 4, 8)
    for bad in ("2,x", "", "0,2", "2,2"):
        with pytest.raises(ValueError, match="distinct positive integers"):
            sweep.parse_counts(bad)
    with pytest.raises(ValueError, match="global_batch=8 must be a multiple of microbatches=3"):
        sweep.scenarios(SMALL, (2, 3))
    with pytest.raises(ValueError, match="lack one of them"):
        sweep.scenarios(SMALL.with_(systems=("zbv", "zero2")), (2,))
    assert [s.microbatches for s in sweep.scenarios(SMALL.with_(zbv_mem_cut=(1, 1, 1, 1)), (2, 8))] == [2, 8]
    assert all(s.zbv_mem_cut is None for s in sweep.scenarios(SMALL.with_(zbv_mem_cut=(1, 1, 1, 1)), (2, 8)))


def test_cross_bench_sweep_the_bubble_zbv_removes_shrinks_as_micro_batches_grow():
    ratios = [simulated_ratio(s) for s in sweep.scenarios(SMALL, (2, 4, 8))]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > 1.3 and ratios[-1] < 1.15, ratios


def test_cross_bench_sweep_cli_says_what_to_change(capsys):
    scenario = ROOT / "bench" / "scenarios" / "tiny.yaml"
    assert sweep.main(["--scenario", str(scenario), "--microbatches", "3"]) == 2
    assert "must be a multiple of microbatches=3" in capsys.readouterr().err


def test_cross_bench_sweep_render_rewrites_the_record_from_its_json_keeping_its_meta(tmp_path):
    row = _row(zbv=([1200.0, 2400.0], 110), zbv_mem=([1200.0, 2400.0], 104))
    first, data = sweep.write(SMALL, [row], tmp_path / "sweep.md", "python -m bench.measured.sweep --scenario x")
    text = first.read_text()
    meta = json.loads(data.read_text())["meta"]
    first.unlink()
    assert sweep.main(["--render", str(data), "--out", str(first)]) == 0
    again = first.read_text()
    assert again == text and meta["date"] in again and meta["commit"] in again


def test_cross_bench_sweep_a_memory_probe_that_dies_costs_only_the_held_column(monkeypatch):
    from bench.measured import memory, vcut

    systems = _row(zbv=([1200.0, 2400.0], 100), zbv_mem=([1200.0, 2400.0], 100))["systems"]

    def dies(*args, **kwargs):
        raise RuntimeError("probe killed")

    monkeypatch.setattr(vcut, "with_measured_cut", lambda scenario: (scenario, None))
    monkeypatch.setattr(runner, "measure", lambda scenario, progress=None: systems)
    monkeypatch.setattr(memory, "breakdown", dies)
    row = sweep.measure_count(SMALL)
    assert row["memory"] == {"error": "RuntimeError: probe killed"} and row["systems"] is systems
    assert "1.20x (1.20-1.20), RSS 1.00x: not judged (held bytes not measured)" in sweep.table([row])[2]


def test_cross_bench_sweep_a_count_that_fails_costs_only_its_row_and_each_row_is_written_as_it_ends(
        monkeypatch, tmp_path):
    row = _row(zbv=([1200.0, 2400.0], 100), zbv_mem=([1200.0, 2400.0], 100))

    def measure_count(scenario, progress=None):
        if scenario.microbatches == 4:
            raise ValueError("no V cut within torch 1F1B's bytes")
        return {**row, "microbatches": scenario.microbatches}

    monkeypatch.setattr(sweep, "measure_count", measure_count)
    written = []
    rows = sweep.run_counts(sweep.scenarios(SMALL, (2, 4, 8)), done=lambda rows: written.append(len(rows)))
    assert [r["microbatches"] for r in rows] == [2, 4, 8] and written == [1, 2, 3]
    assert rows[1] == {"microbatches": 4, "error": "ValueError: no V cut within torch 1F1B's bytes"}
    lines = sweep.table(rows)[2:]
    assert lines[1] == "| 4 | - | - | - | failed: ValueError: no V cut within torch 1F1B's bytes | - | - | - |"
    assert "1.20x" in lines[0] and "1.20x" in lines[2]
    md, data = sweep.write(SMALL.with_(zbv_mem_cut=(1, 1, 1, 1)), rows, tmp_path / "sweep.md", "cmd")
    assert "zbv_mem_cut" not in md.read_text().split("## Full configuration")[1]  # measured per m, not the YAML's


def test_cross_bench_sweep_render_says_what_to_change(tmp_path, capsys):
    other = tmp_path / "measured.json"
    other.write_text(json.dumps({"meta": {}, "systems": {}}))
    for argv, message in ((["--render", str(tmp_path / "gone.json")], "cannot read it as JSON"),
                          (["--render", str(other)], "not a sweep's JSON"),
                          (["--render", str(other), "--rounds", "3"], "--rounds would be ignored")):
        with pytest.raises(SystemExit) as exit_:
            sweep.main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv
