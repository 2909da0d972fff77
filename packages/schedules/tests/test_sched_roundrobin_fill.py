"""``roundrobin``'s fill split: the forward jobs that run first dealt over more devices (``("fill", k, count)``,
``roundrobin_search.FILL_SPLITS``), and the second local search under the whole job split."""

import pytest

from bubbleless_schedules import generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_judge, roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups
from bubbleless_schedules.simulate_steady import steady_state

from .test_sched_roundrobin_split import _split_jobs, profile

QWEN3_32B_LIKE = profile(64, 1.5, 2.1)
"""64 decoder layers (F 1, B 2.1) and a head of 1.5 layers' forward: many one-layer backward jobs."""

CUT = PoolGroups((1,) + (3,) * 21, 1, (1,) * 64)
"""A tapered cut of it: a one-layer first forward group, then groups of 3 layers."""

DRAIN = (("last", "interleaved"), ("tail", 8, 4))


def test_a_fill_split_deals_the_first_forward_jobs_over_more_devices_and_shortens_the_fill():
    plain, costs, _ = roundrobin_search.dispatched(CUT, QWEN3_32B_LIKE, num_devices=8, num_microbatches=16, ahead=1,
                                                   split_job=DRAIN)
    filled, _, _ = roundrobin_search.dispatched(CUT, QWEN3_32B_LIKE, num_devices=8, num_microbatches=16, ahead=1,
                                                split_job=(*DRAIN, ("fill", 8, 2)))
    validate(filled)
    split = _split_jobs(filled)
    assert all(job in split for job in range(8))  # the first 8 forward jobs each run on two devices
    assert not any(job in split for job in range(8, len(CUT.forward)))  # the later ones on one
    assert all(job not in _split_jobs(plain) for job in range(len(CUT.forward)))
    spans = [simulate(s, costs).makespan for s in (plain, filled)]
    assert spans[1] < spans[0] - 1.0, spans  # 551.8 against 554.9


def test_fill_spec_past_the_forward_jobs_splits_only_those_there_are():
    groups = PoolGroups((4, 4), 1, (2, 2, 2, 2))
    filled, _, _ = roundrobin_search.dispatched(groups, profile(8, 2.0, 2.2), num_devices=4, num_microbatches=8,
                                                ahead=1, split_job=(("fill", 8, 2),))
    validate(filled)
    assert set(_split_jobs(filled)) == {0, 1}


@pytest.fixture
def without_fill(monkeypatch):
    def generate_without(**options):
        with monkeypatch.context() as patch:
            patch.setattr(roundrobin_search, "FILL_SPLITS", ())
            patch.setattr(roundrobin_search, "SPLIT_REFINE_BUDGET", 0)
            return generate("roundrobin", **options)
    return generate_without


def test_the_fill_and_second_refinement_shorten_the_step_and_idle_no_more_back_to_back(without_fill):
    # within RoundPipe-like memory: one micro-batch of one layer, and 8 layers of weights per device
    options = {"num_ranks": 8, "num_microbatches": 16, "layer_costs": QWEN3_32B_LIKE, "memory_limit": 8 / 65 + 1e-9,
               "weight_limit": 8}
    ours, before = generate("roundrobin", **options), without_fill(**options)
    validate(ours)
    timings = {name: (simulate(s, job_costs(QWEN3_32B_LIKE, pool_groups(s))).makespan,
                      steady_state(s, job_costs(QWEN3_32B_LIKE, pool_groups(s)), **roundrobin_judge.STEADY_CHECK))
               for name, s in (("ours", ours), ("before", before))}
    assert timings["ours"][0] < timings["before"][0] - 3.0, timings  # 548.7 against 554.3
    assert timings["ours"][1].steady_bubble <= timings["before"][1].steady_bubble + 1e-9


def test_a_pinned_cut_is_not_refined_under_the_job_split():
    pinned = {"forward_stages": [1] + [3] * 21, "last_layers": 1, "backward_stages": [1] * 64}
    ours = generate("roundrobin", num_ranks=8, num_microbatches=16, layer_costs=QWEN3_32B_LIKE, **pinned)
    assert pool_groups(ours) == CUT
