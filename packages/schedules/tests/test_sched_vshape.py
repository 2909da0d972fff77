"""zbv, v-half, v-min: valid for every shape, within their memory bounds, exact closed forms at unit
costs, and never slower than the published references (bench/schedules/reference_v.py, the adapter
over the independent bench/schedules/published_v*.py)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from bubbleless_schedules import Costs, generate, peak_memory, simulate
from bubbleless_schedules.generators.vshape import zbv_script

BOUNDS = {"zbv": lambda p: p, "v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3}
SHAPES = [(p, m) for p in range(1, 9) for m in sorted({1, 2, p, p + 1, 2 * p - 1, 2 * p + 1, 3 * p})]
PROFILES = {
    "realistic": Costs(18.5, 18.1, 9.3, 0.6),
    "comm-heavy": Costs(18.5, 18.1, 9.3, 9.25),
    "cheap-W": Costs(18.5, 18.1, 4.0, 0.6),
}


def _reference():
    path = Path(__file__).resolve().parents[3] / "bench" / "schedules" / "reference_v.py"
    spec = importlib.util.spec_from_file_location("bench_reference_v", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.REFERENCE


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_shape_validates_within_its_memory_bound(name):
    for p, m in SHAPES:
        schedule = generate(name, num_ranks=p, num_microbatches=m)  # generate() validates
        assert schedule.stage_to_rank == tuple(range(p)) + tuple(reversed(range(p)))
        assert max(peak_memory(schedule)) <= BOUNDS[name](p), (name, p, m)
        work = 3 * m  # unit costs: F + I + W of both half-cost chunks, m times
        assert simulate(schedule).makespan >= work - 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("p", range(1, 9))
def test_zbv_meets_the_closed_form_at_unit_costs(p):
    for m in range(2 * p, 3 * p + 1):
        timeline = simulate(generate("zbv", num_ranks=p, num_microbatches=m))
        assert timeline.bubble_rate == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-12), m
        assert timeline.span_bubble_rate == pytest.approx(0.0, abs=1e-12), m
        assert timeline.max_peak_memory <= p
    for m in range(p, 2 * p):  # the whole-makespan bound still holds with fewer micro-batches
        timeline = simulate(generate("zbv", num_ranks=p, num_microbatches=m))
        assert timeline.bubble_rate == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-12), m


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_v_half_and_v_min_reach_their_peak_and_beat_1f1b_bubble(name):
    for p in (4, 6, 8):
        m = 3 * p
        timeline = simulate(generate(name, num_ranks=p, num_microbatches=m))
        assert timeline.max_peak_memory == BOUNDS[name](p)
        one_f_one_b = (p - 1) / (m + p - 1)
        assert timeline.bubble_rate < one_f_one_b


def test_memory_limit_lowers_the_cap_and_too_low_a_limit_says_so():
    schedule = generate("zbv", num_ranks=4, num_microbatches=8, memory_limit=2.5)
    assert max(peak_memory(schedule)) <= 2.5
    with pytest.raises(ValueError, match="memory_limit >= 1"):
        generate("v-min", num_ranks=4, num_microbatches=8, memory_limit=0.5)
    with pytest.raises(ValueError, match="no options"):
        generate("v-half", num_ranks=4, num_microbatches=8, warmup=3)


def test_uses_per_stage_costs():
    p, m = 4, 12
    forward = [1.0] * (2 * p)
    forward[0], forward[-1] = 1.3, 2.0  # embedding a bit slower, LM head twice as slow
    costs = Costs(forward, [1.0] * (2 * p), [0.5] * (2 * p))
    aware = simulate(generate("v-half", num_ranks=p, num_microbatches=m, costs=costs), costs).makespan
    blind = simulate(generate("v-half", num_ranks=p, num_microbatches=m, costs=costs.median()), costs).makespan
    assert aware <= blind + 1e-9


def test_zbv_script_counts():
    for p in range(1, 6):
        for m in (1, p, 2 * p + 1):
            for rank in range(p):
                tokens = zbv_script(rank, p, m)
                assert tokens.count("F0") == tokens.count("F1") == m
                assert tokens.count("W") <= tokens.count("I0") + tokens.count("I1")


def test_cool_down_keeps_each_rank_order_up_to_its_last_admissions():
    from bubbleless_schedules.generators.vshape import search_v_schedule
    from bubbleless_schedules.generators.vshape_cooldown import recooled, scripts_before_last

    p, m, cap = 8, 16, 10.0
    best = search_v_schedule(p, m, Costs.unit(), cap)
    for depth in (1, 2, 4):
        for row, script in zip(best.actions, scripts_before_last(p, m, best.actions, depth), strict=True):
            assert script.count("F0") == m - depth  # cut right before the first-chunk forward of m - depth
            assert len(script) < len(row)
    results = list(recooled(p, m, Costs.unit(), cap, 0.0, best, (1, 2, 4)))
    assert results  # a loop over nothing would pass
    for result in results:
        assert result.peak_chunks <= cap
        assert sorted(map(str, sum(result.actions, ()))) == sorted(map(str, sum(best.actions, ())))


def test_cool_down_never_undoes_the_polish():
    """The adjacent-swap polish also starts from the order the cool-down step replaced: at p=4 m=8, 3 M_B
    and cheap W it polishes to 418.1, while the re-cooled order (faster before the polish) only reached
    420.1."""
    costs = PROFILES["cheap-W"]
    schedule = generate("v-half", num_ranks=4, num_microbatches=8, costs=costs)
    assert simulate(schedule, costs).makespan <= 418.1 + 1e-6


def test_admitting_up_to_the_cap_may_stall_and_says_so():
    """Without the reserved room the list scheduler can deadlock (rank 0 admits two micro-batches into a
    cap of two chunks, so neither can take its second chunk): the try returns None instead of raising."""
    from bubbleless_schedules.generators.vshape_greedy import Policy, v_list_schedule

    greedy = Policy(order=("F0", "F1", "I", "W"), reserve=False)
    assert v_list_schedule(2, 4, Costs.unit(), 2.0, greedy) is None
    assert v_list_schedule(2, 4, Costs.unit(), 2.0, Policy(order=("F0", "F1", "I", "W"))) is not None


KNOWN_GAPS: dict[tuple, float] = {}
"""Cases still slower than the reference, with how much (none: comm-heavy v-min p=8 m=24 at 4 M_B, where
the block search's reorder of a W naming its chunk had won by 0.03%, is 2379.3 vs 2382.5 since the V
search also runs labelled W's)."""


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_never_slower_than_the_published_fixed_patterns(profile):
    costs, reference = PROFILES[profile], _reference()
    for name in ("zbv", "v-half", "v-min"):
        for p in (4, 8):
            for m in (8, 24):
                for limit in (BOUNDS[name](p), None):
                    ref = reference[name](num_ranks=p, num_microbatches=m, costs=costs, memory_limit=limit)
                    limit = limit if limit is not None else max(peak_memory(ref))
                    ours = generate(name, num_ranks=p, num_microbatches=m, costs=costs, memory_limit=limit)
                    slack = KNOWN_GAPS.get((profile, name, p, m, limit), 0.0)
                    assert simulate(ours, costs).makespan <= simulate(ref, costs).makespan * (1 + slack) + 1e-6, (
                        name, p, m, limit)


@pytest.mark.slow
def test_generation_time_at_32_ranks_256_microbatches():
    start = time.perf_counter()
    generate("v-half", num_ranks=32, num_microbatches=256)
    elapsed = time.perf_counter() - start
    assert elapsed < 10.0  # loose on a shared CI core; measured ~0.7 s alone, validation included
