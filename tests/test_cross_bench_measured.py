"""bench/measured (issue 10, section 2): scenarios that say what is wrong, systems that train the same
problem (same loss from the same seed and data), the longest-sequence bisection, and the record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured.runner import longest_sequence, measure  # noqa: E402
from bench.measured.scenario import Scenario, TinyShape, load_scenario, scenario_from_dict  # noqa: E402

SMALL = Scenario(name="test", model=TinyShape(layers=2, hidden=32, heads=2, intermediate=64, vocab=128),
                 seq_len=16, global_batch=4, microbatches=4, steps=2, warmup=1, rounds=1, systems=("ddp",))


def test_cross_bench_measured_the_stored_scenario_loads():
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    assert scenario.name == "tiny" and {"zbv", "1f1b", "roundrobin", "zero-infinity"} <= set(scenario.systems)
    assert (scenario.global_batch, scenario.seq_len, scenario.tokens_per_step) == (8, 256, 8 * 256)  # tiny.yaml


@pytest.mark.parametrize(("change", "message"), [
    ({"systems": ["deepspeed"]}, "unknown measured systems"),
    ({"microbatches": 3}, "multiple of microbatches"),
    ({"global_batch": 6, "microbatches": 3}, "multiple of workers"),
    ({"model": {"layers": 3}}, "layers \\+ 2 = 5 must be a multiple of workers"),
    ({"steps": 0}, "steps must be a positive integer"),
    ({"longest_low": 4096, "longest_high": 1024}, "longest_low=4096 is above longest_high=1024"),
    ({"sequence": 12}, "unknown scenario keys \\['sequence'\\]"),
])
def test_cross_bench_measured_a_bad_scenario_says_what_to_change(change, message):
    with pytest.raises(ValueError, match=message):
        scenario_from_dict({"name": "x", **change})


def test_cross_bench_measured_bisection_finds_the_longest_fitting_sequence():
    scenario = SMALL.with_(longest_low=128, longest_high=8192, longest_granularity=64)
    seen = []

    def fake_probe(scenario, system, seq_len):
        seen.append(seq_len)
        return {"seq_len": seq_len, "fits": seq_len <= 3000}

    found = longest_sequence(scenario, "ddp", probe_fn=fake_probe)
    assert 3000 - 64 <= found["max_seq_len"] <= 3000 and len(found["probes"]) == len(seen) < 12
    assert longest_sequence(scenario, "ddp", probe_fn=lambda *a: {"fits": False})["max_seq_len"] == 0
    capped = longest_sequence(scenario, "ddp", probe_fn=lambda *a: {"fits": True})
    assert capped["max_seq_len"] == 8192 and capped["capped"]


@pytest.mark.slow
def test_cross_bench_measured_our_pipeline_torch_1f1b_and_ddp_train_the_same_problem(tmp_path):
    from bench.measured.report import rerender, write

    scenario = SMALL.with_(systems=("bubbleless-1f1b", "1f1b", "ddp", "roundrobin"))
    systems = measure(scenario)
    assert all("error" not in r for r in systems.values()), {s: r.get("error") for s, r in systems.items()}
    losses = [r["loss"] for r in systems.values()]
    assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), losses
    assert systems["ddp"]["losses"][0] > 0 and len(systems["ddp"]["samples_tokens_per_s"]) == scenario.steps
    md, js = write(scenario, systems, {}, tmp_path / "measured.md", command="test")
    text = md.read_text()
    assert "| bubbleless-1f1b | yes |" in text and "MEASURED" in text and "commit" in text
    if "no plot" not in text:  # matplotlib installed: the PNG the record links is there
        assert "![measured test](measured.png)" in text and (tmp_path / "measured.png").stat().st_size > 0
    data = json.loads(js.read_text())
    assert data["meta"]["scenario"]["name"] == "test" and data["systems"]["ddp"]["loss_equal"] is True
    again, _ = rerender(js, tmp_path / "again.md", calibration=False)  # --render: same record, nothing rerun
    rendered = again.read_text().replace("again.", "measured.")  # the raw figures' and plot's files are named
    assert rendered.split("## Full configuration")[0] == text.split("## Full configuration")[0]


@pytest.mark.slow
def test_cross_bench_measured_deepspeed_zero_infinity_trains_the_same_problem():
    pytest.importorskip("deepspeed")  # `nox -s bench` installs it; the plain test venv may not have it
    systems = measure(SMALL.with_(systems=("ddp", "zero-infinity")))
    assert "error" not in systems["zero-infinity"], systems["zero-infinity"].get("error")
    assert systems["zero-infinity"]["optimizer"] == "DeepSpeedCPUAdam"
    assert systems["zero-infinity"]["loss"] == pytest.approx(systems["ddp"]["loss"], rel=1e-4)


def test_cross_bench_measured_calibration_prices_the_scenario_on_the_cpu_profile():
    from bench.measured.calibration import calibration_rows, calibration_section

    measured = {"1f1b": {"tokens_per_s": 1000.0}, "zero2": {"tokens_per_s": 500.0}, "ddp": {"tokens_per_s": 900.0}}
    rows, unmodelled = calibration_rows(SMALL, measured)
    assert [r.system for r in rows] == ["1f1b", "zero2"] and unmodelled == ["ddp"]
    assert all(r.predicted_tokens_per_s > 0 for r in rows)
    text = "\n".join(calibration_section(SMALL, measured))
    assert "| 1f1b | 1,000.0 |" in text and "Not modelled: ddp" in text
