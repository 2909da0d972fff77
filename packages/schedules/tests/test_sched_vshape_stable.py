"""The published greedy V-Min / V-Half and the blocks run as they are, as candidates of the V search at large
shapes: the lazy PCM block enumeration, the fixed-order timer they are ranked with (generators/
vshape_stable.py, vshape_blocks.py, vshape_fixed.py; issue 11)."""

from __future__ import annotations

import time
from itertools import islice, permutations

import pytest

from bubbleless_schedules import Costs, Schedule, generate, simulate, v_placement
from bubbleless_schedules.generators import vshape, vshape_blocks
from bubbleless_schedules.generators.vshape_fixed import time_fixed_order
from bubbleless_schedules.generators.vshape_greedy import v_list_schedule
from bubbleless_schedules.generators.vshape_stable import stable_greedy_orders

PAPER_1_5B = Costs(forward=18.5, backward_input=18.1, backward_weight=9.3, comm=0.6)


def _sorted_pcm_blocks(p: int, max_split_values: int = 8) -> list[dict]:
    """Every block of the search space built, then sorted by (length, slots): what the lazy order must equal."""
    splits = list(range(1, max(2, p)))
    if len(splits) > max_split_values:
        splits = sorted({splits[round(i * (len(splits) - 1) / (max_split_values - 1))] for i in range(max_split_values)})
    keys = vshape_blocks._keys(p)
    found = set()
    for residues in permutations(range(1, 6), 3):
        for a in range(1, 6):
            for b in range(1, 6):
                for split in splits if a != b else splits[:1]:
                    times = vshape_blocks.pcm_block(p, residues, (a, b), split)
                    if times is not None:
                        found.add(tuple(times[k] for k in keys))
    return [dict(zip(keys, flat, strict=True)) for flat in sorted(found, key=lambda flat: (max(flat) + 1, flat))]


@pytest.mark.parametrize("p", [1, 2, 3, 5, 9, 12, 32])
def test_lazy_pcm_blocks_come_in_the_order_of_building_them_all(p):
    assert vshape_blocks.pcm_blocks(p) == _sorted_pcm_blocks(p)


def test_length_bound_never_exceeds_a_blocks_length():
    for p in (2, 4, 7, 16):
        for bound, frame in vshape_blocks._pcm_frames(p, 8):
            assert bound <= max(vshape_blocks._pcm_times(p, *frame).values()) + 1


def test_the_first_blocks_are_built_lazily():
    """A search that takes the shortest few blocks at p=32 builds only those: far less time than all 924."""
    vshape_blocks._pcm_frames.cache_clear()
    start = time.process_time()
    first = list(islice(vshape_blocks.iter_pcm_blocks(32), 20))
    few = time.process_time() - start
    start = time.process_time()
    every = vshape_blocks.pcm_blocks(32)
    assert first == every[:20]
    assert few < time.process_time() - start


def _greedy_makespan(p: int, m: int, costs: Costs, kind: str) -> float:
    rows = stable_greedy_orders(p, m, kind)
    return simulate(Schedule(rows, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p)), costs).makespan


@pytest.mark.parametrize("name", ["v-min", "v-half", "zbv"])
def test_a_tight_cap_at_p32_is_no_slower_than_the_published_greedy(name):
    """p=32 m=97 under limit 12 (V-Min's cap), the paper's 1.5B costs: the search ranks the greedy with the
    blocks (it was built only up to 12,400 actions, and ours stayed 0.11% above it: 6911.85 vs 6904.05)."""
    p, m = 32, 97
    ours = simulate(generate(name, num_ranks=p, num_microbatches=m, costs=PAPER_1_5B, memory_limit=12), PAPER_1_5B)
    assert max(ours.peak_memory) <= 12 + 1e-9
    assert ours.makespan <= _greedy_makespan(p, m, PAPER_1_5B, "v-min") + 1e-9


@pytest.mark.parametrize("p, m", [(2, 3), (4, 8), (5, 11), (8, 16), (16, 33)])
@pytest.mark.parametrize("labelled", [False, True])
def test_a_fixed_order_times_as_the_list_scheduler_runs_it(p, m, labelled):
    """vshape_fixed's timer gives the list scheduler's result for the same scripts run as is (orders, times,
    spans, peak, admissions), with comm, uneven per-stage costs and a freeing input-gradient."""
    costs = Costs(forward=[1 + 0.1 * s for s in range(2 * p)], backward_input=1.5, backward_weight=0.7, comm=0.3)
    blocks = [*islice(vshape_blocks.iter_pcm_blocks(p), 4), vshape_blocks.stable_block(p, "v-min")]
    for block in blocks:
        scripts = vshape._tokens_of_block(p, m, block, labelled)
        for frees in (0.0, 0.5):
            listed = v_list_schedule(p, m, costs, 1e9, vshape._FIXED_ORDER, frees, scripts)
            fixed = time_fixed_order(p, m, costs, scripts, frees)
            assert fixed.actions == listed.actions
            assert fixed.makespan == pytest.approx(listed.makespan)
            assert fixed.span_sum == pytest.approx(listed.span_sum)
            assert fixed.peak_chunks == pytest.approx(listed.peak_chunks)
            assert fixed.admitted == pytest.approx(listed.admitted)


def test_a_fixed_order_that_waits_on_itself_is_refused():
    scripts = [["I0", "F0", "F1", "I1", "W", "W"], ["F0", "F1", "I1", "I0", "W", "W"]]
    assert time_fixed_order(2, 1, Costs.unit(), scripts) is None


def test_b_heavy_at_p32_is_no_slower_than_the_blocks_order_the_paper_search_wins_with():
    """p=32 m=128, limit 12, B-heavy costs: the published block search wins with a block split after 29 of
    31 rank steps, run as is (736.15); the eight spread split points missed it, and the ranking timed
    only reordered blocks (ours 736.25)."""
    p, m = 32, 128
    costs = Costs(forward=1.0, backward_input=1.5, backward_weight=1.0, comm=0.1)
    block = vshape_blocks.pcm_block(p, (1, 2, 3), (1, 3), 29)
    scripts = vshape._tokens_of_block(p, m, block, True)
    theirs = time_fixed_order(p, m, costs, scripts)
    assert theirs.peak_chunks <= 24
    ours = simulate(generate("v-min", num_ranks=p, num_microbatches=m, costs=costs, memory_limit=12), costs)
    assert ours.makespan <= theirs.makespan + 1e-9


def _v_half_closed_form(p: int, m: int) -> float:
    """3m + b(M)/2 at unit per-rank costs, M = V-Half's 2 floor((p+2)/2) chunks (the paper's b(M))."""
    big_m = 2 * ((p + 2) // 2)
    b = 3 * p - 1 - 3 * big_m + max(3 * p, p + 1 + 2 * ((big_m + 1) // 2))
    return 3 * m + max(b, p - 1) / 2


def test_v_half_meets_its_closed_form_at_m_equal_p12():
    """p=12 m=12 at unit costs: 50.5, half a unit below what the cool-down step reached alone (51.0); the
    wide step (vshape._wide_cool_down) gets there from a block reordered within p actions."""
    timeline = simulate(generate("v-half", num_ranks=12, num_microbatches=12))
    assert timeline.makespan == pytest.approx(_v_half_closed_form(12, 12)) == 50.5
    assert timeline.max_peak_memory <= 7


@pytest.mark.slow
@pytest.mark.parametrize("p, m", [(14, 14), (14, 43), (16, 16)])
def test_v_half_meets_its_closed_form_where_it_missed_by_half_a_unit(p, m):
    timeline = simulate(generate("v-half", num_ranks=p, num_microbatches=m))
    assert timeline.makespan == pytest.approx(_v_half_closed_form(p, m))
    assert timeline.max_peak_memory <= (p + 2) // 2
