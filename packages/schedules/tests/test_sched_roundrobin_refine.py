"""``roundrobin_refine``: the local search that chooses the round-robin cut together with the dispatch."""

import pytest

from bubbleless_schedules import Costs, generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_cut, roundrobin_refine, roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import candidate_cuts, job_costs
from bubbleless_schedules.generators.roundrobin_refine import neighbours, refine
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups


def profile(layers: int, head: float, backward: float, comm: float = 0.1) -> Costs:
    half = backward / 2
    return Costs([1.0] * layers + [head], [half] * layers + [head], [half] * layers + [head], comm)


def lower_bound(layer_costs: Costs, schedule) -> float:
    costs = job_costs(layer_costs, pool_groups(schedule))
    work = sum(s.end - s.start for s in simulate(schedule, costs).spans)
    return work / schedule.num_workers


def test_neighbours_keep_every_layer_and_move_one_step():
    start = PoolGroups((3, 6, 3), 1, (1, 2, 3, 3, 3))
    seen = list(neighbours(start))
    assert len(seen) == len(set(seen)) and start not in seen
    for cut in seen:
        assert cut.num_layers == start.num_layers and sum(cut.forward) == sum(cut.backward)
    assert PoolGroups((4, 5, 3), 1, (1, 2, 3, 3, 3)) in seen  # one layer across a forward boundary
    assert PoolGroups((3, 6, 2), 2, (1, 2, 3, 3, 2)) in seen  # the body's top layer into the fused group
    assert PoolGroups((9, 3), 1, (1, 2, 3, 3, 3)) in seen  # two forward groups merged
    assert PoolGroups((3, 6, 3), 1, (1, 2, 3, 3, 1, 2)) in seen  # a backward group split


def test_refine_stops_at_a_local_minimum_and_within_its_budget():
    start, target = PoolGroups((3, 6, 3), 1, (1, 2, 3, 3, 3)), PoolGroups((3, 6, 3), 1, (3, 3, 3, 3))
    calls = []

    def evaluate(cut):  # one neighbour is better, every cut around it is worse
        calls.append(cut)
        return 0.0 if cut == target else 2.0

    best, span = refine(start, 1.0, evaluate, actions_per_evaluation=lambda cut: 1, budget=1_000)
    assert (best, span) == (target, 0.0)
    assert len(calls) == list(neighbours(start)).index(target) + 1 + len(list(neighbours(target)))
    calls.clear()
    assert refine(start, 1.0, evaluate, actions_per_evaluation=lambda cut: 1, budget=1) == (start, 1.0)
    assert len(calls) == 1


def test_refined_cut_balances_a_small_model_better_than_every_cap_packed_cut(monkeypatch):
    # 12 layers on 4 devices, 8 micro-batches: a handful of jobs per device
    layer_costs = profile(12, 3.0, 2.6)
    # B only and no job split over devices: the refinement under test (a split of a cap-packed cut, where a
    # device ends its next job's early recompute after its part of the fused group, reaches 140.6)
    monkeypatch.setattr(roundrobin_search, "SPLITS", ())
    monkeypatch.setattr(roundrobin_search, "grown_fused", lambda *args, **kwargs: [])
    monkeypatch.setattr(roundrobin_search, "TAIL_SPLITS", ())
    monkeypatch.setattr(roundrobin_search, "fused_devices", lambda *args: None)  # and no fine cuts: the
    monkeypatch.setattr(roundrobin_cut, "FINE_FORWARD", ())  # fine cut with the head split is a candidate
    refined = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs,
                       split_backward=False)
    validate(refined)
    span = simulate(refined, job_costs(layer_costs, pool_groups(refined))).makespan
    assert span >= lower_bound(layer_costs, refined) - 1e-9
    assert pool_groups(refined) not in candidate_cuts(layer_costs)
    monkeypatch.setattr(roundrobin_refine, "ACTION_BUDGET", 0)
    monkeypatch.setattr(roundrobin_search, "SPLIT_REFINE_BUDGET", 0)  # nor the second one, under the job split
    packed = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs,
                      split_backward=False)
    packed_span = simulate(packed, job_costs(layer_costs, pool_groups(packed))).makespan
    assert span < packed_span - 1.0, (span, packed_span)  # 144.7 against 146.5


@pytest.mark.parametrize("pinned", [{"forward_stages": [6, 5], "last_layers": 2, "backward_stages": [3, 3, 3, 2]}])
def test_a_pinned_cut_is_not_refined(pinned):
    layer_costs = profile(12, 3.0, 2.6)
    ours = generate("roundrobin", num_ranks=4, num_microbatches=6, layer_costs=layer_costs, **pinned)
    assert pool_groups(ours) == PoolGroups((6, 5), 2, (3, 3, 3, 2))


def test_a_long_forward_taper_starts_the_devices_sooner_and_is_a_candidate():
    from bubbleless_schedules.generators.roundrobin_cut import TAPERS, tapered_cut
    from bubbleless_schedules.generators.roundrobin_search import dispatched

    layer_costs = profile(28, 3.0, 2.6)  # qwen3-1.7b-like: 28 layers, the head 3 layers' worth
    long = tapered_cut(layer_costs, 9.0, taper=8, backward_taper=2)
    # forward caps 1/9, 2/9, ... of 9: one more layer a group; the two last-run backward groups of one layer
    assert long == PoolGroups((1, 2, 3, 4, 5, 6, 7), 1, (1, 1) + (2,) * 13)
    assert long in candidate_cuts(layer_costs)

    def best(tapers):
        cuts = [tapered_cut(layer_costs, 9.0 * f, taper=t, backward_taper=b) for t, b in tapers for f in (1.0, 1.1)]
        return min(dispatched(g, layer_costs, num_devices=8, num_microbatches=32, ahead=1, weight_transfers=False)[2]
                   for g in cuts)

    assert best(TAPERS) < best(TAPERS[:3]) - 1.0


def test_the_search_dispatches_within_its_budget_on_a_large_model(monkeypatch):
    from bubbleless_schedules.generators import roundrobin_search

    dispatched_actions = []
    real = roundrobin_search.list_dispatch

    def counting(groups, *args, **kwargs):
        rows, makespan = real(groups, *args, **kwargs)
        dispatched_actions.append(sum(len(row) for row in rows))
        return rows, makespan

    monkeypatch.setattr(roundrobin_search, "list_dispatch", counting)
    monkeypatch.setattr(roundrobin_search, "SEARCH_BUDGET", 20_000)
    layer_costs = profile(64, 1.5, 2.1)  # qwen3-32b-like: many one-layer backward jobs
    ours = generate("roundrobin", num_ranks=8, num_microbatches=16, layer_costs=layer_costs)
    validate(ours)
    largest = max(dispatched_actions)
    # candidates stop at half the budget, the finalists' three look-ahead variants add at most 9 dispatches,
    # their splits of the pacing jobs (the fused group and the heaviest job, two ways each) at most 12, the
    # fill's splits 3, and the second local search (under the whole job split) at most half the budget;
    # the grown branch's re-cut (``evened_forward``: three fill splits and the other drain) 4 more and,
    # when its plan wins, that winner's I/W tries 4 (here 123,232 actions, 99,936 without the re-cut)
    assert sum(dispatched_actions) <= 20_000 + 10_000 + 29 * largest
    assert len(dispatched_actions) < len(candidate_cuts(layer_costs)) + 24 + 10_000 // min(dispatched_actions)
