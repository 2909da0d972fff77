"""A cool-down try resumed part-way (generators/vshape_resume.py) is the try run from time 0: same actions and
peak, makespan and spans to float rounding, over the bases the V search re-cools (its candidates' orders) and
several depths. (Rounding: the list scheduler starts an action that is ready within 1e-12 of an event at that
event, the fixed-order timer at the later of the two; sums of the same costs in another order can differ by an
ulp, which at small times is below 1e-12.)"""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs
from bubbleless_schedules.generators import vshape
from bubbleless_schedules.generators.vshape_cooldown import (
    COOL_DOWN,
    COOL_DOWN_ADMITTING,
    scripts_before_last,
)
from bubbleless_schedules.generators.vshape_greedy import v_list_schedule
from bubbleless_schedules.generators.vshape_improve import _fixed_result
from bubbleless_schedules.generators.vshape_resume import fixed_timing, state_at_cut
from bubbleless_schedules.generators.vshape_stable import stable_greedy_orders

COSTS = [Costs(1, 1, 1, 0), Costs(18.5, 18.1, 9.3, 0.6), Costs(1, 1, 1, 0.5), Costs(1, 1, 0.5, 0.05),
         Costs(1, 1.5, 1, 0.1)]


def _bases(p, m, costs, cap, frees):
    yield _fixed_result(p, m, stable_greedy_orders(p, m, "v-min"), costs, frees)
    yield _fixed_result(p, m, [vshape.zbv_formatted(r, p, m) for r in range(p)], costs, frees)
    for policy in vshape._POLICIES[:3]:
        yield v_list_schedule(p, m, costs, cap, policy, frees)


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("p, m", [(4, 9), (5, 16), (8, 17), (16, 50)])
@pytest.mark.parametrize("frees", [0.0, 0.25])
def test_resumed_tries_are_the_tries_from_time_zero(p, m, costs, frees):
    cap = 2.0 * ((p + 4) // 3 if m < 30 else (p + 2) // 2)
    resumed = 0
    for base in _bases(p, m, costs, cap, frees):
        times = fixed_timing(p, m, costs, base, frees)
        if times is None:
            continue
        for policy in (COOL_DOWN, COOL_DOWN_ADMITTING):
            for depth in (1, 2, 4, 8):
                scripts = scripts_before_last(p, m, base.actions, depth)
                state = state_at_cut(p, m, costs, base.actions, times, scripts, frees)
                fresh = v_list_schedule(p, m, costs, cap, policy, frees, scripts)
                again = v_list_schedule(p, m, costs, cap, policy, frees, scripts, resume=state)
                assert (again is None) == (fresh is None), (depth, policy)
                if fresh is not None:
                    assert again.actions == fresh.actions and again.peak_chunks == fresh.peak_chunks
                    assert again.makespan == pytest.approx(fresh.makespan, rel=1e-12, abs=1e-9)
                    assert again.span_sum == pytest.approx(fresh.span_sum, rel=1e-12, abs=1e-9)
                resumed += state is not None and state.remaining < 6 * p * m
    assert resumed  # some tries did start part-way
