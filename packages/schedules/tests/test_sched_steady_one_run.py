"""``first_free_placements`` tries a guessed continuation in one run and keeps the placements it confirms: the
placements, and so every steady figure, equal those of one run per iteration (the rule as written: each
iteration's placement from a run of the iterations before it), while most plans need one or two runs."""

import pytest

from bubbleless_schedules import Costs, generate, simulate_steady
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.layouts import layout_of
from bubbleless_schedules.roundrobin_layout import pool_groups
from bubbleless_schedules.simulate import action_rules
from bubbleless_schedules.simulate_steady import first_free_placements

LAYER_COSTS = {
    "even": Costs([1.0] * 8 + [3.0], [1.1] * 8 + [3.0], [1.1] * 8 + [3.0], 0.1),
    "b-heavy": Costs([1.0] * 8 + [3.0], [2.1] * 8 + [3.0], [2.1] * 8 + [3.0], 0.1),
    "head": Costs([1.0] * 6 + [4.0], [1.2] * 6 + [4.0], [1.0] * 6 + [3.0], 0.2),
}


def _one_run_per_iteration(run, devices: int, iterations: int) -> list:
    alone = run([tuple(range(devices))])
    rows = sorted(range(devices), key=lambda r: (alone.first_compute[0][r], r))
    placements = [tuple(range(devices))]
    while len(placements) < iterations:
        frees = run(placements).frees[-1]
        order = sorted(range(devices), key=lambda d: (frees[d], d))
        placement = [0] * devices
        for row, device in zip(rows, order, strict=True):
            placement[row] = device
        placements.append(tuple(placement))
    return placements


def _runner(schedule, costs, load_stream, in_flight, calls):
    requires, produces, durations = action_rules(layout_of(schedule), schedule, costs)
    kinds = [[a.kind for a in row] for row in schedule.actions]
    stages = [[a.stage for a in row] for row in schedule.actions]

    def run(placements):
        calls.append(len(placements))
        return simulate_steady._run(requires, produces, durations, kinds, stages, costs.comm, tuple(placements),
                                    load_stream, load_stream, in_flight)

    return run


@pytest.mark.parametrize("profile", sorted(LAYER_COSTS))
@pytest.mark.parametrize(("devices", "microbatches"), [(2, 8), (3, 6), (4, 8), (4, 12)])
@pytest.mark.parametrize(("load_stream", "in_flight"), [(False, None), (True, 2)])
def test_one_run_of_a_guess_finds_the_placements_of_one_run_per_iteration(profile, devices, microbatches,
                                                                          load_stream, in_flight):
    layer_costs = LAYER_COSTS[profile]
    schedule = generate("roundrobin", num_ranks=devices, num_microbatches=microbatches, layer_costs=layer_costs)
    costs = job_costs(layer_costs, pool_groups(schedule))
    guessed, each = [], []
    found = first_free_placements(_runner(schedule, costs, load_stream, in_flight, guessed), devices, 12)
    assert found == _one_run_per_iteration(_runner(schedule, costs, load_stream, in_flight, each), devices, 12)
    assert sum(guessed) <= 2 * sum(each)  # at worst a run of every iteration per placement


def test_most_plans_need_few_runs():
    layer_costs = LAYER_COSTS["b-heavy"]
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs)
    costs = job_costs(layer_costs, pool_groups(schedule))
    calls = []
    first_free_placements(_runner(schedule, costs, True, 2, calls), 4, 12)
    assert len(calls) <= 4, calls  # 1, 12, 12, 12: 37 iterations; one run per iteration, 12 runs and 67
