"""bench/check.py (issue 10, section 4): the regression check fails on a planted drop and passes on the
stored baselines; the measured half fails only beyond its written-down noise threshold."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.check import BASELINES, check_set, compare, main  # noqa: E402
from bench.figures import FIGURE_SETS, modelled_key  # noqa: E402
from bench.measured_baseline import MIN_DROP, noise_threshold  # noqa: E402

SETS = {s.name: s for s in FIGURE_SETS}
CHEAP_MODELLED = {modelled_key(s, "qwen3-1.7b", "a800", 8) for s in ("zero-infinity", "zero2", "1f1b", "zb")}
"""Modelled points that price in milliseconds (round-robin and zbv plan for seconds; CI checks them all)."""


def plant(folder: Path, name: str, group: str, key: str, factor: float) -> float:
    path = folder / f"{name}.json"
    data = json.loads(path.read_text())
    data["figures"][group][key] *= factor
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data["figures"][group][key]


@pytest.fixture
def baselines(tmp_path: Path) -> Path:
    folder = tmp_path / "baselines"
    shutil.copytree(BASELINES, folder)
    return folder


def test_cross_bench_check_passes_on_the_stored_baselines():
    for name in ("schedules", "ratios"):
        findings = check_set(SETS[name], BASELINES)
        assert not [f.line() for f in findings if f.fails or f.kind == "new"], name  # every figure compared
    assert not [f.line() for f in check_set(SETS["modelled"], BASELINES, keys=CHEAP_MODELLED)
                if f.fails or f.kind == "new"]
    stored = json.loads((BASELINES / "modelled.json").read_text())["figures"]
    assert all(CHEAP_MODELLED <= set(figures) for figures in stored.values())  # the cheap keys are stored ones


def test_cross_bench_check_cli_fails_on_a_planted_makespan_regression(baselines, capsys):
    # the baseline claims zbv was 5% faster than it is: the fresh makespan is a drop
    planted = plant(baselines, "schedules", "makespan", "zbv p4 m8 unit", 0.95)
    assert main(["--baselines", str(baselines), "--only", "schedules"]) == 1
    out = capsys.readouterr().out
    assert "DROP    schedules/makespan/zbv p4 m8 unit" in out and f"{planted:g}" in out
    assert "bench check FAILED: 1 figure(s)" in out


def test_cross_bench_check_fails_on_a_raised_modelled_figure_and_passes_a_lowered_one(baselines):
    key = modelled_key("zero2", "qwen3-1.7b", "a800", 8)
    plant(baselines, "modelled", "tokens_per_s", key, 1.01)
    [finding] = [f for f in check_set(SETS["modelled"], baselines, keys={key}) if f.kind != "new"]
    assert finding.kind == "drop" and finding.fails and finding.name == f"modelled/tokens_per_s/{key}"
    plant(baselines, "modelled", "tokens_per_s", key, 0.5)  # baseline now below the fresh figure: a gain
    assert [f.kind for f in check_set(SETS["modelled"], baselines, keys={key})] == ["gain"]


def test_cross_bench_check_a_figure_gone_from_the_fresh_set_fails():
    findings = compare({"zbv p4 m8 unit": 25.5, "gone p4 m8 unit": 3.0}, {"zbv p4 m8 unit": 25.5}, "lower")
    assert [(f.name, f.kind, f.fails) for f in findings] == [("gone p4 m8 unit", "missing", True)]
    assert compare({"a": 1.0}, {"a": 1.0 + 1e-9}, "lower") == []  # rounding is not a drop
    with pytest.raises(ValueError, match="direction must be"):
        compare({}, {}, "up")


def test_cross_bench_check_update_rewrites_a_baseline_as_a_readable_diff(baselines):
    plant(baselines, "schedules", "makespan", "1f1b p2 m4 unit", 2.0)
    assert main(["--baselines", str(baselines), "--only", "schedules", "--update"]) == 0
    text = (baselines / "schedules.json").read_text()
    assert text == (BASELINES / "schedules.json").read_text()  # deterministic: same bytes as the stored one
    assert text.splitlines()[1].startswith('  "about"') and '"1f1b p2 m4 unit": 15.0' in text


def test_cross_bench_check_a_missing_baseline_folder_is_one_error_line(tmp_path, capsys):
    assert main(["--baselines", str(tmp_path / "nonexist"), "--only", "ratios"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: no baseline ") and len(captured.err.splitlines()) == 1


def test_cross_bench_check_update_of_matching_keys_keeps_every_other_figure(baselines, capsys):
    key = modelled_key("zero2", "qwen3-1.7b", "a800", 8)
    stored = json.loads((baselines / "modelled.json").read_text())
    for group in stored["figures"].values():
        del group[key]  # as if the figure were new
    plant_text = json.dumps(stored, indent=2, sort_keys=True) + "\n"
    (baselines / "modelled.json").write_text(plant_text)
    assert main(["--baselines", str(baselines), "--only", "modelled", "--update", "--key", "zero2 qwen3-1.7b a8*"]) == 0
    assert (baselines / "modelled.json").read_text() == (BASELINES / "modelled.json").read_text()  # put back alone
    assert main(["--baselines", str(baselines), "--only", "modelled", "--key", key]) == 0
    assert "modelled: 0 drop, 0 missing, 0 gain, 0 new" in capsys.readouterr().out
    assert main(["--baselines", str(baselines), "--only", "modelled", "--update", "--key", "nothing *"]) == 2
    assert "error: --key nothing *: matches no figure of modelled" in capsys.readouterr().err
    assert (baselines / "modelled.json").read_text() == (BASELINES / "modelled.json").read_text()  # untouched


def test_cross_bench_check_tracks_the_datacenter_zbv_over_1f1b_claim():
    """README: zbv 1.05-1.18x torch 1F1B on 8 A800 / MI300X / H200, 1.14-1.15x on the 235B LoRA (modelled)."""
    stored = json.loads((BASELINES / "modelled.json").read_text())["figures"]
    for hw in ("mi300x", "h200"):
        for model in ("qwen3-1.7b", "llama-3.1-8b", "qwen3-32b", "qwen3-235b-a22b"):
            zbv, base = (stored["tokens_per_s"][modelled_key(s, model, hw, 8)] for s in ("zbv", "1f1b"))
            assert 1.05 <= round(zbv / base, 2) <= 1.18, (model, hw)
            if model == "qwen3-235b-a22b":
                assert 1.14 <= round(zbv / base, 2) <= 1.15, hw
            assert stored["max_seq_len"][modelled_key("zbv", model, hw, 8)] > 0
    cheap = {modelled_key("1f1b", m, hw, 8) for m in ("qwen3-1.7b", "qwen3-235b-a22b") for hw in ("mi300x", "h200")}
    assert not [f.line() for f in check_set(SETS["modelled"], BASELINES, keys=cheap)]


def _run(folder: Path, name: str, medians: dict, samples: dict, machine: str = "test-machine") -> Path:
    path = folder / name
    path.write_text(json.dumps({
        "meta": {"machine": machine, "scenario": {"name": "tiny"}, "date": "d", "commit": "c"},
        "systems": {s: {"tokens_per_s": v, "samples_tokens_per_s": samples[s]} for s, v in medians.items()}}))
    return path


def test_cross_bench_check_measured_drop_beyond_the_noise_threshold_fails(tmp_path, capsys):
    noisy = [80.0, 100.0, 120.0, 100.0, 90.0, 110.0]  # MAD 10 of 100: threshold 3 x 10% = 30%
    runs = [_run(tmp_path, f"r{i}.json", {"zbv": 100.0, "1f1b": 50.0},
                 {"zbv": noisy, "1f1b": [50.0, 50.5, 49.5]}) for i in range(2)]
    assert main(["--baselines", str(tmp_path), "--update", "--no-deterministic", "--measured", *map(str, runs)]) == 0
    stored = json.loads((tmp_path / "measured.json").read_text())
    assert stored["figures"]["tiny/zbv/tokens_per_s"]["threshold"] == pytest.approx(0.3)
    assert stored["figures"]["tiny/1f1b/tokens_per_s"]["threshold"] == MIN_DROP  # quiet: the floor
    ok = _run(tmp_path, "ok.json", {"zbv": 75.0, "1f1b": 46.0}, {"zbv": [75.0], "1f1b": [46.0]})
    assert main(["--baselines", str(tmp_path), "--no-deterministic", "--measured", str(ok)]) == 0
    bad = _run(tmp_path, "bad.json", {"zbv": 75.0, "1f1b": 44.0}, {"zbv": [75.0], "1f1b": [44.0]})
    assert main(["--baselines", str(tmp_path), "--no-deterministic", "--measured", str(bad)]) == 1
    assert "DROP    measured/tiny/1f1b/tokens_per_s" in capsys.readouterr().out
    elsewhere = _run(tmp_path, "x.json", {"zbv": 1.0, "1f1b": 1.0}, {"zbv": [1.0], "1f1b": [1.0]}, machine="other")
    assert main(["--baselines", str(tmp_path), "--no-deterministic", "--measured", str(elsewhere)]) == 0
    assert "skipped: measured on 'other'" in capsys.readouterr().out


def test_cross_bench_check_noise_threshold_counts_run_to_run_spread():
    tight = [100.0, 100.0, 100.0, 140.0, 140.0]  # per-step spread (median absolute deviation) 0
    threshold, spread = noise_threshold([100.0, 140.0], tight)  # the runs' medians 40 apart around 120
    assert spread == pytest.approx(20 / 120) and threshold == pytest.approx(0.5)
    assert noise_threshold([120.0], tight) == (MIN_DROP, 0.0)  # one run: nothing but the floor
    threshold, spread = noise_threshold([120.0], [100.0, 100.0, 140.0, 140.0])  # per-step spread alone
    assert spread == pytest.approx(20 / 120) and threshold == pytest.approx(0.5)
