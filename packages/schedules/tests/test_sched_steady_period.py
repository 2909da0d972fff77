"""``steady_state``'s period: the mean distance between iteration ends after the fill, over an even number
of them. With two iterations in flight a plan may end them in pairs (one job per device: each device runs
every other iteration whole), and the old mean over all ends, ``(ends[-1] - ends[0]) / (n - 1)``, then
gave a period below work / devices, which no plan can run at, and a steady bubble of 0."""

import pytest

from bubbleless_schedules import Costs, generate
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups
from bubbleless_schedules.simulate_steady import _period_span, pool_steady_state

ONE_JOB = generate("roundrobin", num_ranks=2, num_microbatches=4, num_layers=4, forward_stages=0, backward_stages=0,
                   last_layers=4)


def test_one_job_plan_is_one_device_s_whole_iteration():
    assert pool_groups(ONE_JOB) == PoolGroups(forward=(), last=4, backward=())
    assert [len(row) > 0 for row in ONE_JOB.actions] == [True, False]


@pytest.mark.parametrize("iterations", [4, 5, 6, 12])
def test_iterations_ending_in_pairs_give_half_the_iteration_time(iterations):
    state = pool_steady_state(ONE_JOB, Costs.unit(), iterations=iterations)
    # two devices end two iterations per 24 (one device's whole iteration, LOADs and STOREs included); the old
    # mean over all ends gave 8, 12, 9.6 and 10.9 at 4, 5, 6 and 12 iterations (ends 24, 24, 48, 48, ...)
    assert state.makespan == pytest.approx(24.0)
    assert state.period == pytest.approx(12.0)
    assert state.period >= state.work / 2 - 1e-9


@pytest.mark.parametrize(("iterations", "span"), [(2, 1), (3, 2), (4, 2), (5, 2), (6, 4), (12, 10)])
def test_period_span_is_even_from_iteration_one_when_there_are_enough(iterations, span):
    assert _period_span(iterations) == span


def test_the_search_s_idle_check_runs_enough_iterations_to_see_pairs():
    # roundrobin_judge.no_idler_than compares plans' steady bubbles under STEADY_CHECK; with 2 iterations the
    # span is iteration 0's end to 1's, so a plan that ends them in pairs got period 0 and always passed
    from bubbleless_schedules.generators.roundrobin_judge import STEADY_CHECK
    from bubbleless_schedules.simulate_steady import steady_state

    state = steady_state(ONE_JOB, Costs.unit(), **STEADY_CHECK)
    assert state.period >= state.work / 2 - 1e-9
    assert state.steady_bubble >= 0.0
