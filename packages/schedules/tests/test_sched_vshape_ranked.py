"""The V search's large-shape path: block peaks counted from slots, the short-run ranking and its
extrapolation (generators/vshape.py ``_ranked_search``, issue 11)."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs, Schedule, generate, simulate, v_placement, validate
from bubbleless_schedules.generators import vshape
from bubbleless_schedules.generators.vshape_blocks import pcm_blocks, stable_block, steady_peak
from bubbleless_schedules.generators.vshape_greedy import v_list_schedule


def _order_peak(p: int, m: int, block: dict) -> int:
    return max(vshape._peak_chunks(row) for row in vshape._tokens_of_block(p, m, block))


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_steady_peak_bounds_every_repetition_and_equals_a_long_one(p):
    blocks = [*pcm_blocks(p), stable_block(p, "v-half"), stable_block(p, "v-min")]
    for block in blocks:
        length = max(block.values()) + 1
        steady = steady_peak(p, block)
        for m in (1, 2, length // 6 + 1):
            assert _order_peak(p, m, block) <= steady
        for m in (length // 6 + 2, length // 6 + 5):
            assert _order_peak(p, m, block) == steady == vshape._block_peak(p, block, m)


@pytest.mark.parametrize("p", [4, 6, 8])
def test_extrapolation_is_exact_for_a_periodic_order_at_unit_costs(p):
    """The stable V-Min pattern run as is at unit costs repeats exactly: a run of 2p micro-batches
    predicts the makespan of 3p and 6p to the slot."""
    cap = 2 * ((p + 4) // 3)
    block = stable_block(p, "v-min")
    unit = Costs.unit()

    def run(m):
        return v_list_schedule(p, m, unit, cap, vshape._FIXED_ORDER, 0.0, vshape._tokens_of_block(p, m, block))

    short = run(2 * p)
    assert len(short.admitted) == 2 * p
    for m in (3 * p, 6 * p):
        assert vshape._extrapolated(short, m) == pytest.approx(run(m).makespan)


def test_extrapolation_is_close_under_real_costs():
    p, cap, costs = 8, 8, Costs(18.5, 18.1, 9.3, 0.6)
    block = stable_block(p, "v-min")

    def run(m):
        return v_list_schedule(p, m, costs, cap, vshape._FIXED_ORDER, 0.0, vshape._tokens_of_block(p, m, block))

    predicted, actual = vshape._extrapolated(run(2 * p), 6 * p), run(6 * p).makespan
    assert abs(predicted / actual - 1) < 0.005


@pytest.mark.parametrize("p, m", [(4, 12), (6, 20), (8, 24)])
def test_ranked_search_returns_a_valid_schedule_within_the_cap(p, m):
    cap = 2.0 * ((p + 4) // 3)
    for costs in (Costs.unit(), Costs(1, 1, 1, 0.5)):
        best = vshape._ranked_search(p, m, costs, cap, 0.0)
        schedule = Schedule(best.actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
        validate(schedule)
        timeline = simulate(schedule, costs)
        assert 2 * timeline.max_peak_memory <= cap + 1e-9
        assert timeline.makespan == pytest.approx(best.makespan)


def test_ranked_only_for_tight_caps_at_large_shapes():
    assert vshape._ranks_candidates(32, 256, 24.0)
    assert vshape._ranks_candidates(32, 97, 24.0)
    assert not vshape._ranks_candidates(32, 64, 24.0)  # the full search still fits its budget
    assert not vshape._ranks_candidates(32, 256, 34.0)  # V-Half's cap: the list scheduler competes
    assert not vshape._ranks_candidates(16, 64, 12.0)


def test_comm_heavy_p32_reaches_the_block_search():
    """p=32 m=97, comm 0.5 per hop, V-Min's cap: the first two candidates gave 670.5 against the
    block-search reference's 658.5 (bench/results/large_shapes.md); ranking reaches the block it wins with."""
    costs = Costs(1.0, 1.0, 1.0, 0.5)
    schedule = generate("v-min", num_ranks=32, num_microbatches=97, costs=costs, memory_limit=12)
    assert simulate(schedule, costs).makespan <= 658.5 + 1e-9


def _pcm_block_rank_by_rank(p, residues, steps, split):
    """``pcm_block`` as it read before its O(1) collision test: every rank's four residues compared."""
    from bubbleless_schedules.action import Kind
    from bubbleless_schedules.generators.vshape_blocks import _next_with_residue, _place_weight_grads

    step = [0] + [steps[0] if r <= split else steps[1] for r in range(1, p)]
    down = [0] * p
    for r in range(1, p):
        down[r] = down[r - 1] + step[r]
    up_last = _next_with_residue(down[-1] + p, residues[0]) - (p - 1)
    grad_down = [_next_with_residue(up_last + p, residues[1])]
    for r in range(1, p):
        grad_down.append(grad_down[-1] + step[r])
    grad_up_last = _next_with_residue(grad_down[-1] + p, residues[2]) - (p - 1)
    times = {}
    for r in range(p):
        f0, f1, i1, i0 = down[r], up_last + p - 1 - r, grad_down[r], grad_up_last + p - 1 - r
        taken = {f0 % 6, f1 % 6, i1 % 6, i0 % 6}
        if len(taken) < 4:
            return None
        s0, s1 = r, 2 * p - 1 - r
        times[(Kind.F, s0)], times[(Kind.F, s1)], times[(Kind.I, s1)], times[(Kind.I, s0)] = f0, f1, i1, i0
        _place_weight_grads(times, taken, ((s1, i1), (s0, i0)))
    return times


@pytest.mark.parametrize("p", [1, 2, 5, 8, 13])
def test_pcm_block_collision_test_agrees_with_checking_every_rank(p):
    from itertools import permutations

    from bubbleless_schedules.generators.vshape_blocks import pcm_block

    found = 0
    for residues in permutations(range(1, 6), 3):
        for a in range(1, 6):
            for b in range(1, 6):
                for split in range(1, max(2, p)):
                    block = pcm_block(p, residues, (a, b), split)
                    assert block == _pcm_block_rank_by_rank(p, residues, (a, b), split)
                    found += block is not None
    assert found  # the search space is not all collisions
