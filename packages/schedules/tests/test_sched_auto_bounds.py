"""What ``auto`` prunes and skips with (generators/auto.py, bounds.py): the bound of a built schedule with the
fused backward's chain below each rank never exceeds the simulated makespan, and the V family's published
makespan is the simulator's for the order it returns."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bubbleless_schedules import Costs, available, generate, simulate
from bubbleless_schedules.generators.auto import _built_bound, _stage_bound
from bubbleless_schedules.generators.bounds import placement_bound
from bubbleless_schedules.registry import generator


def _random_costs(rng: random.Random) -> Costs:
    return Costs(rng.uniform(0.5, 3), rng.uniform(0.5, 3), rng.uniform(0.05, 2), rng.choice([0.0, rng.uniform(0, 2)]))


CHEAP = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "dualpipev")
"""The stage-bound names without a search (fused backward and split), cheap enough for many random shapes."""


@pytest.mark.parametrize("seed", range(4))
def test_built_bound_never_exceeds_the_makespan(seed):
    rng = random.Random(seed)
    names = [n for n in CHEAP if n in available() and _stage_bound(n)]
    fused_seen = 0
    for _ in range(10):
        p = rng.choice([2, 3, 4, 6, 8])
        m = rng.choice([p, 2 * p, 3 * p + 1, rng.randint(1, 3 * p)])
        costs = _random_costs(rng)
        for name in names:
            try:
                schedule = generate(name, num_ranks=p, num_microbatches=m, costs=costs)
            except ValueError:
                continue
            if schedule.stage_to_rank is None:
                continue
            bound, makespan = _built_bound(schedule, costs), simulate(schedule, costs).makespan
            assert bound <= makespan + 1e-9, (name, p, m, costs)
            plain = placement_bound(schedule.stage_to_rank, m, costs)
            fused_seen += bound > plain + 1e-9
    assert fused_seen  # the chain term is exercised, not always zero


def test_the_chain_makes_the_bound_tight_for_gpipe_at_unit_costs():
    """GPipe at unit costs, no comm, reaches (p-1) + 3m + (p-1): the head, the work and the B chain below."""
    p, m = 4, 8
    costs = Costs(1, 1, 1, 0)
    schedule = generate("gpipe", num_ranks=p, num_microbatches=m, costs=costs)
    assert _built_bound(schedule, costs) == simulate(schedule, costs).makespan == (p - 1) + 3 * m + 2 * (p - 1)


@pytest.mark.parametrize("name", ["zbv", "v-half", "v-min"])
@pytest.mark.parametrize("p, m", [(4, 4), (4, 13), (6, 7)])
@pytest.mark.parametrize("costs", [Costs(1, 1, 1, 0), Costs(18.5, 18.1, 9.3, 0.6), Costs(1, 1.5, 1, 0.1)])
@pytest.mark.parametrize("limit", [None, 2.0])
def test_v_family_publishes_the_simulators_makespan(name, p, m, costs, limit):
    schedule = generate(name, num_ranks=p, num_microbatches=m, costs=costs, memory_limit=limit)
    known = generator(name).makespan_of(schedule, costs, limit, 0.0)
    assert known == simulate(schedule, costs).makespan
    other = replace(schedule, actions=schedule.actions[::-1])
    assert generator(name).makespan_of(other, costs, limit, 0.0) is None  # not the search's order: simulate it
