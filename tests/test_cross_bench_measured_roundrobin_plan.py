"""bench/measured's round-robin pool runs the plan its cost model prices (bench/measured/rr_plan.py): the
same plan every build, the model's, and the calibration says whether the row compares the same plan."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured.rr_plan import build_pool, model_plan, plan_record, same_plan  # noqa: E402
from bench.measured.scenario import load_scenario  # noqa: E402

TINY = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")


def test_cross_bench_measured_roundrobin_plan_is_the_same_every_build_and_the_models():
    first, second = (plan_record(build_pool(TINY, seq_len=TINY.seq_len)) for _ in range(2))
    assert first == second
    priced = model_plan(TINY, seq_len=TINY.seq_len)
    assert same_plan(first, priced) is None
    assert first["microbatches_per_pool_step"] == TINY.microbatches
    assert first["schedule"].startswith("# bubbleless-schedule name=roundrobin")


def test_cross_bench_measured_roundrobin_plan_names_what_differs():
    priced = model_plan(TINY, seq_len=TINY.seq_len)
    other = {**priced, "groups": {**priced["groups"], "last": priced["groups"]["last"] - 1}}
    assert "groups: ran" in same_plan(other, priced)
    assert same_plan(None, priced) == "the run recorded no plan"


def test_cross_bench_measured_roundrobin_calibration_says_whether_it_prices_the_plan_that_ran():
    from bench.measured.calibration import _plan_note

    ran = plan_record(build_pool(TINY, seq_len=TINY.seq_len))
    assert "runs the plan the model prices" in _plan_note(TINY, {"roundrobin": {"tokens_per_s": 1.0, "plan": ran}})
    wrong = {**ran, "microbatches_per_pool_step": 2}
    note = _plan_note(TINY, {"roundrobin": {"tokens_per_s": 1.0, "plan": wrong}})
    assert "two different plans" in note and "microbatches_per_pool_step: ran 2" in note
    assert _plan_note(TINY, {"roundrobin": {"error": "x"}}) == ""
