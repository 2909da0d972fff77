"""``roundrobin``'s widest drain: the drain's very last job dealt over every device (``("tail", 1, N)``,
``roundrobin_search.widest_drain``), kept only when faster and no idler back to back; and the round-robin
layout's whole-schedule rule table (``RoundRobinLayout.rule_rows``) the simulator asks."""

import pytest

from bubbleless_schedules import Costs, generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_judge, roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.layouts import layout_of
from bubbleless_schedules.roundrobin_layout import pool_groups
from bubbleless_schedules.simulate_steady import steady_state

from .test_sched_roundrobin_fill import CUT, DRAIN, QWEN3_32B_LIKE


def _devices_of(schedule, job: int) -> set[int]:
    return {d for d, row in enumerate(schedule.actions) for a in row if a.stage == job and a.microbatch is not None}


def test_the_last_job_over_every_device_ends_the_devices_together():
    plain, costs, _ = roundrobin_search.dispatched(CUT, QWEN3_32B_LIKE, num_devices=8, num_microbatches=16, ahead=1,
                                                   split_job=DRAIN)
    widest, _, _ = roundrobin_search.dispatched(CUT, QWEN3_32B_LIKE, num_devices=8, num_microbatches=16, ahead=1,
                                                split_job=(*DRAIN, ("tail", 1, 8)))
    validate(widest)
    last = CUT.num_stages - 1
    # its 8 parts go to the devices that free first (6 of them here: two end a part and take another)
    assert len(_devices_of(plain, last)) == 4 and len(_devices_of(widest, last)) > 4
    assert all(len(_devices_of(widest, job)) == 4 for job in range(last - 7, last))  # the rest of the drain as it was
    timelines = [simulate(s, costs) for s in (plain, widest)]
    ends = [[max(span.end for span in row) for row in t.per_worker] for t in timelines]
    assert max(ends[1]) - min(ends[1]) < max(ends[0]) - min(ends[0]) - 3.0, ends  # spread 5.3 against 10.8
    assert timelines[1].makespan < timelines[0].makespan - 2.0, [t.makespan for t in timelines]  # 551.8 against 554.9


@pytest.mark.parametrize(("split_job", "expected"), [
    ((("last", "interleaved"), ("tail", 8, 4)), [(("last", "interleaved"), ("tail", 8, 4), ("tail", 1, 8))]),
    (("last", "interleaved"), [(("last", "interleaved"), ("tail", 1, 8)),
                               (("last", "interleaved"), ("tail", 8, 4), ("tail", 1, 8))]),
    ((), [(("tail", 1, 8),), (("tail", 8, 4), ("tail", 1, 8))]),
    ((("tail", 8, 4), ("tail", 1, 8)), []),
])
def test_widest_drain_adds_the_last_job_over_every_device_to_the_plans_split(split_job, expected):
    assert roundrobin_search.widest_drain(split_job, 8) == expected


def test_widest_drain_is_off_with_the_drain_splits(monkeypatch):
    monkeypatch.setattr(roundrobin_search, "TAIL_SPLITS", ())
    assert roundrobin_search.widest_drain((), 8) == []


def test_the_widest_drain_shortens_the_step_and_idles_no_more_back_to_back(monkeypatch):
    # within RoundPipe-like memory: one micro-batch of one layer, and 8 layers of weights per device
    options = {"num_ranks": 8, "num_microbatches": 16, "layer_costs": QWEN3_32B_LIKE, "memory_limit": 8 / 65 + 1e-9,
               "weight_limit": 8}
    ours = generate("roundrobin", **options)
    with monkeypatch.context() as patch:
        patch.setattr(roundrobin_search, "widest_drain", lambda *args: [])
        before = generate("roundrobin", **options)
    validate(ours)
    figures = {}
    for name, s in (("ours", ours), ("before", before)):
        costs = job_costs(QWEN3_32B_LIKE, pool_groups(s))
        figures[name] = (simulate(s, costs).makespan, steady_state(s, costs, **roundrobin_judge.STEADY_CHECK))
    assert figures["ours"][0] < figures["before"][0] - 2.0, figures
    assert figures["ours"][1].steady_bubble <= figures["before"][1].steady_bubble + 1e-9
    assert len(_devices_of(ours, pool_groups(ours).num_stages - 1)) > 4


@pytest.mark.parametrize("split_backward", [False, True])
def test_round_robin_rule_rows_equal_the_per_action_methods(split_backward):
    layer_costs = QWEN3_32B_LIKE
    schedule, _, _ = roundrobin_search.dispatched(CUT, layer_costs, num_devices=8, num_microbatches=8, ahead=2,
                                                  split_backward=split_backward, split_job=(*DRAIN, ("fill", 4, 2)))
    layout = layout_of(schedule)
    for costs in (job_costs(layer_costs, CUT), Costs(1.0, 0.5, 0.25, comm=0.1, load=0.3, store=0.2)):
        requires, produces, durations = layout.rule_rows(schedule, costs)
        for w, row in enumerate(schedule.actions):
            assert requires[w] == [layout.requires(a, schedule) for a in row]
            assert produces[w] == [layout.produces(a, schedule) for a in row]
            assert durations[w] == [layout.cost(a, schedule, costs) for a in row]


def test_round_robin_rule_rows_refuse_what_the_methods_refuse():
    schedule, _, _ = roundrobin_search.dispatched(CUT, QWEN3_32B_LIKE, num_devices=8, num_microbatches=4, ahead=1)
    with pytest.raises(ValueError, match="per-stage values"):
        layout_of(schedule).rule_rows(schedule, Costs((1.0, 2.0), 1.0, 1.0))

