"""Fine round-robin cuts: one body layer per backward group, the fused group split over devices."""

import pytest

from bubbleless_schedules import Costs, generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_cut, roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import candidate_cuts, job_costs
from bubbleless_schedules.generators.roundrobin_dispatch import (
    JobTimes,
    assignment_of,
    dispatch_units,
    list_dispatch,
)
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups

# 28 layers and a head whose F + B (3 + 6) is 2.5 body layers' R + B (1 + 2.6): the head paces a cut
# cap-packed around it (two-layer backward groups), so its devices wait between micro-batches
HEAVY_HEAD = Costs([1.0] * 28 + [3.0], [1.3] * 28 + [3.0], [1.3] * 28 + [3.0], 0.1)


def _span(schedule, layer_costs):
    return simulate(schedule, job_costs(layer_costs, pool_groups(schedule))).makespan


def test_candidates_include_cuts_of_one_body_layer_per_backward_group():
    fine = [c for c in candidate_cuts(HEAVY_HEAD) if set(c.backward) == {1}]
    assert fine and all(c.last == 1 for c in fine)
    assert {max(c.forward) for c in fine} >= {2, 3}  # FINE_FORWARD's forward caps: 0.6 ... 1 of R + B


def test_fused_devices_splits_the_head_only_where_it_paces():
    fine = PoolGroups((3,) * 9 + (1,), 1, (1,) * 28)
    assert roundrobin_search.fused_devices(fine, HEAVY_HEAD, 8, 16) == 3  # 9 / 3.6 -> 3 devices
    assert roundrobin_search.fused_devices(fine, HEAVY_HEAD, 2, 16) == 2  # at most every device
    coarse = PoolGroups((7, 7, 7, 7), 1, (4,) * 7)  # backward jobs of 14.4 per micro-batch: the head does not pace
    assert roundrobin_search.fused_devices(coarse, HEAVY_HEAD, 8, 16) is None


def test_a_fine_cut_with_the_head_split_beats_every_coarse_plan(monkeypatch):
    ours = generate("roundrobin", num_ranks=8, num_microbatches=16, layer_costs=HEAVY_HEAD, split_backward=False)
    validate(ours)
    groups = pool_groups(ours)
    span = _span(ours, HEAVY_HEAD)
    work = sum(s.end - s.start for s in simulate(ours, job_costs(HEAVY_HEAD, groups)).spans)
    assert span >= work / 8 - 1e-9
    head_devices = {d for d, row in enumerate(ours.actions) for a in row if a.stage == groups.last_stage}
    assert len(head_devices) >= 2  # the fused group runs on two or more devices
    monkeypatch.setattr(roundrobin_cut, "FINE_FORWARD", ())
    monkeypatch.setattr(roundrobin_search, "fused_devices", lambda *args: None)
    coarse = generate("roundrobin", num_ranks=8, num_microbatches=16, layer_costs=HEAVY_HEAD, split_backward=False)
    assert span < 0.97 * _span(coarse, HEAVY_HEAD), (span, _span(coarse, HEAVY_HEAD))


def _times(groups):
    costs = job_costs(HEAVY_HEAD, groups)
    backward = tuple(i + w for i, w in zip(costs.backward_input, costs.backward_weight, strict=True))
    return JobTimes(costs.forward, costs.recompute, backward, costs.comm)


def test_a_given_assignment_is_what_the_rows_run():
    groups = PoolGroups((4, 4), 2, (2, 2, 2, 2))
    units = dispatch_units(groups.num_stages, 4)
    dealt, _ = list_dispatch(groups, _times(groups), 3, 4, 1)
    assignment = assignment_of(dealt, units)
    assert list_dispatch(groups, _times(groups), 3, 4, 1, assignment=assignment)[0] == dealt
    moved = (0,) * len(units)  # every job on device 0, one after another: no waits, no comm
    rows, makespan = list_dispatch(groups, _times(groups), 3, 4, 1, assignment=moved)
    assert rows[1] == rows[2] == [] and assignment_of(rows, units) == moved
    times = _times(groups)
    per_microbatch = [times.forward[j] if groups.role(j) == "forward" else times.backward[j]
                      + (times.forward[j] if groups.role(j) == "last" else times.recompute[j])
                      for j in range(groups.num_stages)]
    assert makespan == pytest.approx(4 * sum(per_microbatch))


@pytest.mark.parametrize("assignment", [(0, 1), (0, 1, 2, 3, 4, 5, 9), "0000000", (0, 1, 0.5, 1, 0, 1, 0),
                                        (0, True, 0, 1, 0, 1, 0)])
def test_a_bad_assignment_says_what_to_give(assignment):
    groups = PoolGroups((4, 4), 2, (2, 2, 2, 2))
    with pytest.raises(ValueError, match="one device in 0..2 per unit"):
        list_dispatch(groups, _times(groups), 3, 4, 1, assignment=assignment)


def test_two_parts_of_one_job_on_one_device_run_one_after_the_other():
    groups = PoolGroups((4, 4), 2, (2, 2, 2, 2))
    parts = {groups.last_stage: (range(0, 2), range(2, 4))}
    units = dispatch_units(groups.num_stages, 4, parts=parts)
    together = tuple(1 if job == groups.last_stage else 0 for job, _ in units)
    rows, _ = list_dispatch(groups, _times(groups), 3, 4, 1, parts=parts, assignment=together)
    assert {a.stage for a in rows[1]} == {groups.last_stage}  # one device may run both parts, in turn
