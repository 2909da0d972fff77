"""``roundrobin_search``'s simulator judgement: each candidate simulated once per search (``judged``), and no
duplicate widest-drain candidate where the drain already ends on every device (``widest_drain``)."""

import pytest

from bubbleless_schedules import generate, validate
from bubbleless_schedules.generators import roundrobin_judge, roundrobin_search

from .test_sched_roundrobin_refine import profile


@pytest.mark.parametrize("objective", ["makespan", "period"])
def test_each_finalist_is_simulated_once_per_search(monkeypatch, objective):
    judged = []
    real = roundrobin_judge.OBJECTIVES[objective]

    def counting(schedule, costs):
        judged.append(id(schedule))  # no transfers inserted: the entry's own schedule, so one id per entry
        return real(schedule, costs)

    monkeypatch.setitem(roundrobin_judge.OBJECTIVES, objective, counting)
    ours = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=profile(12, 3.0, 2.6),
                    weight_transfers=False, objective=objective)
    validate(ours)
    # the main branch's finalists are judged for ``first`` and again among every branch's for ``winner``
    assert len(judged) > 1 and len(judged) == len(set(judged)), judged


def test_the_widest_drain_is_not_tried_again_where_the_drain_ends_on_every_device():
    four = ("tail", 4, 4)  # TAIL_SPLITS' (8, 4) on 4 devices: the last 4 jobs over all 4 devices each
    assert roundrobin_search.widest_drain((("last", "interleaved"), four), 4) == []
    assert roundrobin_search.widest_drain((four,), 4) == []
    assert roundrobin_search.widest_drain((("last", "interleaved"),), 4) == [(("last", "interleaved"), ("tail", 1, 4))]
    assert roundrobin_search.widest_drain((("tail", 1, 2),), 4) == [(("tail", 1, 2), ("tail", 1, 4))]


def test_no_plan_is_dispatched_twice_per_search(monkeypatch):
    dispatches = []
    real = roundrobin_search.list_dispatch

    def recording(groups, times, *args, **kwargs):
        dispatches.append(repr((groups, times, args, sorted(kwargs.items()))))
        return real(groups, times, *args, **kwargs)

    monkeypatch.setattr(roundrobin_search, "list_dispatch", recording)
    # 12 layers on 4 devices: the local searches step back onto cuts they left, the fused group's split is
    # written ("last", "interleaved") and ("last", "interleaved", 2), and the I/W search meets the winners'
    # I/W plans (9 of 436 dispatches were repeats)
    validate(generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=profile(12, 3.0, 2.6)))
    assert len(dispatches) > 100 and len(dispatches) == len(set(dispatches))
