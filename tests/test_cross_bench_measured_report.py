"""bench/measured's record: ratios paired round by round (pooled medians mislead under swinging load),
and a system the machine cannot run reported as skipped, not failed."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured import runner  # noqa: E402
from bench.measured.paired import paired_ratio  # noqa: E402
from bench.measured.report import failures, goals, write  # noqa: E402
from bench.measured.scenario import Scenario, TinyShape  # noqa: E402

SMALL = Scenario(name="test", model=TinyShape(layers=2, hidden=32, heads=2, intermediate=64, vocab=128),
                 seq_len=16, global_batch=4, microbatches=4, steps=2, warmup=1, rounds=3, systems=("zbv", "1f1b"))


def _run(tokens_per_s: float, round_index: int) -> dict:
    """A fake run at a steady ``tokens_per_s`` (both timed steps alike)."""
    step_s = SMALL.tokens_per_step / tokens_per_s
    return {"times": [step_s, step_s], "losses": [3.0, 2.5, 2.0], "peak_growth_bytes": 100 * 2**20,
            "processes": 2, "threads": 1, "round": round_index}


def _systems(rounds: dict[str, list[float]]) -> dict:
    return {name: runner.merge(SMALL, [_run(v, i) for i, v in enumerate(values)]) for name, values in rounds.items()}


# Round 0 loaded for both; in round 1 torch 1F1B ran while another job loaded the machine and zbv after it
# had finished. Pooled, zbv's median is 3,800 against 1F1B's 2,000 (1.9x); paired, two rounds of three
# say 0.95x.
DISAGREE = {"zbv": [1900.0, 3800.0, 3800.0], "1f1b": [2000.0, 2000.0, 4000.0]}


def test_cross_bench_measured_the_ratio_pairs_rounds_instead_of_pooling_them():
    systems = _systems(DISAGREE)
    assert systems["zbv"]["tokens_per_s"] / systems["1f1b"]["tokens_per_s"] > 1.8  # what pooling says
    paired = paired_ratio(systems, "zbv", "1f1b")
    assert (paired.median, paired.low, paired.high, paired.rounds) == (0.95, 0.95, 1.9, 3)
    assert paired.text() == "0.95x (0.95-1.90)"


def test_cross_bench_measured_the_goal_verdict_uses_the_paired_median(tmp_path):
    systems = _systems(DISAGREE)
    (line,) = goals(SMALL, systems, {})
    assert "0.95x tokens/s (NOT met; the median of the 3 per-round ratios" in line, line
    assert "min-max 0.95-1.90x" in line and "pooled medians' quotient, 1.90x" in line
    text = write(SMALL, systems, {}, tmp_path / "measured.md", command="test")[0].read_text()
    assert "| zbv | yes | 3,800 |" in text and "| 0.95x (0.95-1.90) |" in text  # absolute pooled, ratio paired


def test_cross_bench_measured_a_failed_round_does_not_shift_the_pairing():
    runs = [_run(1900.0, 0), {"error": "RuntimeError: died", "round": 1}, _run(3800.0, 2)]
    systems = {"zbv": runner.merge(SMALL, runs), **_systems({"1f1b": [2000.0, 1000.0, 4000.0]})}
    assert systems["zbv"]["round_of_run"] == [0, 2]
    assert paired_ratio(systems, "zbv", "1f1b").median == 0.95  # rounds 0 and 2, not 0 and 1


def test_cross_bench_measured_a_system_the_machine_cannot_run_is_skipped_not_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "skip_reason", lambda system: "no libaio here" if system == "ddp" else "")
    monkeypatch.setattr(runner, "run_system", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    systems = runner.measure(SMALL.with_(systems=("ddp",), rounds=2))
    assert systems["ddp"] == {"skipped": "no libaio here", "runs": 0}
    assert failures(systems) == [] and failures({"x": {"error": "E: died", "runs": 1}}) == ["x"]
    text = write(SMALL.with_(systems=("ddp",)), systems, {}, tmp_path / "measured.md", command="test")[0].read_text()
    assert "| ddp | baseline | skipped: no libaio here |" in text and "failed" not in text.split("## Goals")[0]
