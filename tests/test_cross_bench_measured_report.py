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
from bench.measured.report import failures, goals, same_memory_verdict, write  # noqa: E402
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


def test_cross_bench_measured_one_round_judges_no_goal():
    systems = _systems({"zbv": [3800.0], "1f1b": [2000.0]})  # 1.9x in one round: a smoke test's luck
    (line,) = goals(SMALL, systems, {})
    assert "1.90x tokens/s (not judged: one round is a smoke test, not evidence" in line, line
    assert "(met" not in line and "NOT met;" not in line


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


def _profile(train_ms: list[float]):
    from bubbleless_partition import LayerCost, Profile

    return Profile(layers=tuple(LayerCost(name=str(i), forward=t / 3, input_grad=t / 3, weight_grad=t / 3)
                                for i, t in enumerate(train_ms)))


def test_cross_bench_measured_zbv_mem_takes_the_fastest_v_cut_within_1f1b_memory():
    from bench.measured.vcut import choose_v_cut, compositions, rank_peaks
    from bubbleless_schedules import generate

    assert len(list(compositions(8, 4))) == 35 and all(sum(c) == 8 and min(c) >= 1 for c in compositions(8, 4))
    # the tiny model's shape: embedding (nothing saved), six decoder layers, the head (a third of a layer)
    layer_bytes, train = [0, 30, 30, 30, 30, 30, 30, 10], [0.1, 3, 3, 3, 3, 3, 3, 2]
    found = choose_v_cut(_profile(train), layer_bytes, workers=2, microbatches=8)
    zbv = generate("zbv", num_ranks=2, num_microbatches=8)
    assert max(rank_peaks(zbv, [30, 60, 60, 40])) > found.limit  # the even V cut holds more than 1F1B
    assert max(found.peaks) <= found.limit == 180  # 1F1B's rank 0: two micro-batches of three layers
    assert found.sizes == (2, 1, 2, 3) and found.predicted_ms < found.baseline_ms


def test_cross_bench_measured_zbv_mem_without_a_cut_says_how_to_get_one():
    import pytest

    from bench.measured.ours import memory_cut
    from bench.measured.scenario import scenario_from_dict

    with pytest.raises(ValueError, match="with_measured_cut"):
        memory_cut(SMALL, "zbv-mem")
    assert memory_cut(SMALL.with_(zbv_mem_cut=(1, 1, 1, 1)), "zbv-mem") == [1, 1, 1, 1]
    assert memory_cut(SMALL, "zbv") is None
    with pytest.raises(ValueError, match="must give 4 stages"):
        SMALL.with_(zbv_mem_cut=(2, 2))
    again = scenario_from_dict(SMALL.with_(zbv_mem_cut=(1, 1, 1, 1)).as_dict())
    assert again.zbv_mem_cut == (1, 1, 1, 1)


def test_same_memory_is_not_met_when_the_longest_sequence_was_not_measured():
    # A run with --no-longest checks only peak RSS; it must not call the whole memory goal met.
    assert same_memory_verdict(True, (None, None)) == "not judged (RSS half met)"
    assert same_memory_verdict(True, (4096, None)) == "not judged (RSS half met)"
    assert same_memory_verdict(False, (None, None)) == "NOT met"
    assert same_memory_verdict(True, (4096, 2048)) == "met"
    assert same_memory_verdict(True, (2048, 4096)) == "NOT met"
