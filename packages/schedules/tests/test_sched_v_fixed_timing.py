"""The V search times fixed orders (the published ZB-V order, the published greedy's) with the fast fixed-order
timer instead of the simulator when it can (generators/vshape_improve.py ``_fixed_result``): its figures must be
the simulator's, and an order the timer would run differently must still go to the simulator."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs
from bubbleless_schedules.action import Kind
from bubbleless_schedules.generators import vshape
from bubbleless_schedules.generators.vshape_improve import _fixed_result, _simulated_result
from bubbleless_schedules.generators.vshape_stable import stable_greedy_orders

COSTS = [Costs(1, 1, 1, 0), Costs(18.5, 18.1, 9.3, 0.6), Costs(1, 1.5, 1, 0.1), Costs(1, 1, 0.5, 0.05),
         Costs([1.3, 1, 1, 1, 1, 1, 1, 2], 1, 1, 0.3)]


def _orders(p: int, m: int):
    yield [vshape.zbv_formatted(r, p, m) for r in range(p)]
    for kind in ("v-half", "v-min"):
        yield stable_greedy_orders(p, m, kind)


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("p, m", [(4, 4), (4, 9), (4, 13), (3, 7)])
@pytest.mark.parametrize("frees", [0.0, 0.3])
def test_fast_timing_gives_the_simulators_figures(p, m, costs, frees):
    if costs.num_stages_given() not in (None, 2 * p):
        pytest.skip("per-stage costs for another stage count")
    for rows in _orders(p, m):
        fast, simulated = _fixed_result(p, m, rows, costs, frees), _simulated_result(p, m, rows, costs, frees)
        assert fast.actions == simulated.actions
        assert fast.makespan == pytest.approx(simulated.makespan, abs=1e-9)
        assert fast.span_sum == pytest.approx(simulated.span_sum, abs=1e-9)
        assert fast.peak_chunks == simulated.peak_chunks


def test_an_order_the_timer_would_reorder_goes_to_the_simulator():
    """Two W's of one stage out of their I's order: ``W0`` / ``W1`` run the oldest pending, so the timer's
    order differs from the rows, and the simulator times the rows as given."""
    p, m, costs = 4, 8, Costs(1, 1, 1, 0.1)
    rows = [list(vshape.zbv_formatted(r, p, m)) for r in range(p)]
    row = rows[0]
    first, second = [i for i, a in enumerate(row) if a.kind is Kind.W and a.stage == 0][:2]
    row.insert(second, row.pop(first))  # a W only ends a chain: running it later keeps the order valid
    assert row[second - 1].microbatch > row[second].microbatch
    result = _fixed_result(p, m, rows, costs, 0.0)
    assert result.actions == tuple(map(tuple, rows))
    assert result == _simulated_result(p, m, rows, costs, 0.0)
