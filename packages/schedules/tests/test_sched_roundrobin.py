"""The ``roundrobin`` generator (RoundPipe's dispatch) and its layout: job structure, the group cut
kept in meta, the cost and memory conventions, the wavefront, and refusals that say what to change."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Action, Costs, Kind, Schedule, generate, simulate, validate
from bubbleless_schedules.roundrobin_layout import PoolGroups, peak_weight_layers, pool_groups

SMALL = dict(num_ranks=2, num_microbatches=3, num_layers=4)


def _spans(timeline):
    return {str(s.action): (s.start, s.end) for s in timeline.spans}


def test_small_pool_literal():
    """4 layers, 2 devices: one forward group of 3 layers, the fused last layer, 3 backward groups of 1."""
    schedule = generate("roundrobin", **SMALL)
    assert schedule.to_text() == (
        "# bubbleless-schedule name=roundrobin stages=5 microbatches=3 layout=roundrobin "
        "meta.forward_layers=3 meta.last_layers=1 meta.backward_layers=1,1,1\n"
        "0LOAD 0F0 0F1 0F2 2LOAD 2R0 2B0 2R1 2B1 2R2 2B2 2STORE 4LOAD 4R0 4B0 4R1 4B1 4R2 4B2 4STORE\n"
        "1LOAD 1F0 1B0 1F1 1B1 1F2 1B2 1STORE 3LOAD 3R0 3B0 3R1 3B1 3R2 3B2 3STORE\n"
    )
    assert schedule.stage_to_rank is None
    groups = pool_groups(schedule)
    assert [groups.role(j) for j in range(5)] == ["forward", "last", "backward", "backward", "backward"]
    assert [list(groups.layers(j)) for j in range(5)] == [[0, 1, 2], [3], [2], [1], [0]]


def test_makespan_by_hand():
    """Unit costs are per rank's share (L/p = 2 layers): the 3-layer forward job costs 1.5 per
    micro-batch, 1-layer jobs F=R=0.5 and B=I+W=1. Device 0: job 0 in [0, 4.5], job 2 in [4.5, 9];
    device 1: job 1 starts when 0F0 ends (1.5), ends at 6; job 3 in [6, 10.5] sends gradients at 7.5,
    9, 10.5; job 4 on device 0 from 9: R0 B0 R1 B1 R2 B2 ends at 13.5."""
    timeline = simulate(generate("roundrobin", **SMALL))
    spans = _spans(timeline)
    assert spans["0F0"] == (0.0, 1.5) and spans["1F0"] == (1.5, 2.0) and spans["1B0"] == (2.0, 3.0)
    assert spans["3B2"] == (9.5, 10.5) and spans["4B2"] == (12.5, 13.5)
    assert timeline.makespan == 13.5
    assert timeline.peak_memory == (0.5, 0.5)  # one micro-batch of a 1-layer group: 1 * p / L


def test_wavefront_next_job_starts_per_microbatch():
    """Job k+1 starts micro-batch 0 as soon as job k finished it (plus the host hop), not after job k."""
    costs = Costs(1.0, 1.0, 1.0, comm=0.25)
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=5, num_layers=8, forward_stages=[2, 2, 2, 1],
                        backward_stages=7, weight_transfers=False)
    spans = _spans(simulate(schedule, costs))
    for job in range(1, 4):
        assert spans[f"{job}F0"][0] == pytest.approx(spans[f"{job - 1}F0"][1] + 0.25)
        assert spans[f"{job}F0"][0] < spans[f"{job - 1}F4"][1]  # overlaps the previous job
    assert spans["5B0"][0] == pytest.approx(spans["4B0"][1] + 0.25)  # gradients flow the same way


def test_load_runs_while_the_device_waits_for_its_first_input():
    """A LOAD occupies its device (no overlap with compute is modelled) but fills the wait for input."""
    costs = Costs(1.0, 1.0, 1.0, load=0.5, store=0.25)
    spans = _spans(simulate(generate("roundrobin", **SMALL), costs))
    assert spans["0LOAD"] == (0.0, 0.75)  # 0.5 per rank's share * 3 layers * 2 / 4
    assert spans["1LOAD"] == (0.0, 0.25) and spans["1F0"][0] == spans["0F0"][1] == 2.25
    assert spans["1STORE"][1] - spans["1STORE"][0] == 0.125
    assert spans["2LOAD"][0] == spans["0F2"][1]  # in the device's order, right after the previous job


def test_jobs_go_round_robin_over_the_pool():
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=2)
    for worker, row in enumerate(schedule.actions):
        assert {a.stage % 3 for a in row} == {worker}
        jobs = [a.stage for a in row if a.kind is Kind.LOAD]
        assert jobs == sorted({a.stage for a in row})


def test_default_groups_are_asymmetric_by_the_cost_ratio():
    unit = pool_groups(generate("roundrobin", num_ranks=4, num_microbatches=5, num_layers=32))
    assert unit.backward == (2,) * 15 and unit.last == 2  # round(32 / 16) layers per backward group
    assert unit.forward == (6,) * 5  # (R + I + W) / F = 3 times as many layers
    cheap_backward = Costs(2.0, 1.0, 1.0)  # ratio (2 + 1 + 1) / 2 = 2
    groups = pool_groups(generate("roundrobin", num_ranks=4, num_microbatches=5, num_layers=32, costs=cheap_backward))
    assert groups.forward == (4,) * 6 + (3,) * 2  # 30 layers in ceil(30 / 4) near-equal groups


def test_explicit_groups_and_counts():
    schedule = generate("roundrobin", num_ranks=2, num_microbatches=2, forward_stages=[4, 4],
                        backward_stages=[3, 3, 2], last_layers=2)
    groups = pool_groups(schedule)
    assert groups == PoolGroups((4, 4), 2, (3, 3, 2)) and groups.num_layers == 10
    # backward group at layers 6-7 recomputes from layer 5's output (forward job 1), 3-5 from layer 2's (job 0)
    layout_requires = _requires(schedule)
    assert layout_requires["3R0"] == (("F", 1, 0),) and layout_requires["4R0"] == (("F", 0, 0),)
    assert layout_requires["5R0"] == () and layout_requires["5B0"] == (("R", 5, 0), ("G", 4, 0))
    assert layout_requires["2B0"] == (("F", 2, 0),) and layout_requires["2F0"] == (("F", 1, 0),)
    counted = pool_groups(generate("roundrobin", num_ranks=2, num_microbatches=2, num_layers=11,
                                   last_layers=1, forward_stages=3, backward_stages=4))
    assert counted.forward == (4, 3, 3) and counted.backward == (3, 3, 2, 2)


def _requires(schedule):
    from bubbleless_schedules.layouts import layout_of

    layout = layout_of(schedule)
    return {str(a): layout.requires(a, schedule) for _, _, a in schedule.all_actions()}


def test_meta_survives_text_and_csv_and_simulates_the_same():
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=4, forward_stages=[3, 3],
                        backward_stages=[2, 2, 2], last_layers=1)
    costs = Costs(1.0, 2.0, 0.5, comm=0.1, load=0.3, store=0.2)
    for copy in (Schedule.from_text(schedule.to_text()), Schedule.from_csv(schedule.to_csv())):
        assert copy == schedule
        assert simulate(copy, costs).spans == simulate(schedule, costs).spans


def test_per_stage_costs_are_used_as_given():
    schedule = generate("roundrobin", **SMALL)
    per_job = Costs([3.0, 1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0],
                    recompute=[0, 0, 0.5, 0.5, 0.5], load=[1, 1, 1, 1, 1], store=0.0)
    spans = _spans(simulate(schedule, per_job))
    assert spans["0F0"][1] - spans["0F0"][0] == 3.0 and spans["1B0"][1] - spans["1B0"][0] == 3.0
    assert spans["2R0"][1] - spans["2R0"][0] == 0.5 and spans["2LOAD"][1] - spans["2LOAD"][0] == 1.0
    with pytest.raises(ValueError, match="costs give 3 per-stage values but the schedule has 5 stages"):
        simulate(schedule, Costs([1, 1, 1], 1, 1))


def test_memory_is_one_microbatch_of_the_largest_gradient_group():
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=6, forward_stages=[6, 6],
                        backward_stages=[2, 4, 2, 4], last_layers=4)
    # forward jobs hold nothing on the device; R / last F hold n * p / L = n * 4 / 16 until B frees it
    # jobs in order: forward 6, 6 | last 4 | backward groups top-down 4, 2, 4, 2; device d runs d, d+4
    assert simulate(schedule).peak_memory == (0.5, 1.0, 1.0, 1.0)
    assert peak_weight_layers(schedule) == (8, 10, 6, 4)  # with prefetch, two consecutive jobs' weights


def test_memory_limit_shrinks_the_groups():
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=5, num_layers=32, memory_limit=0.2)
    assert max(simulate(schedule).peak_memory) == 0.125  # the default 2-layer groups would hold 0.25
    assert pool_groups(schedule).backward == (1,) * 31
    with pytest.raises(ValueError, match="below one layer's activations"):
        generate("roundrobin", num_ranks=4, num_microbatches=5, num_layers=8, memory_limit=0.25)


def test_single_fused_job_and_single_device():
    schedule = generate("roundrobin", num_ranks=1, num_microbatches=2, num_layers=2, last_layers=2)
    assert schedule.to_text().splitlines()[1:] == ["0LOAD 0F0 0B0 0F1 0B1 0STORE"]
    assert simulate(schedule).makespan == 6.0  # 2 * (F + I + W), the whole model on the one device


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(forward_stages=[2, 2], backward_stages=[3]), "backward_stages=\\[3\\] covers 3 layers"),
        (dict(num_layers=4, forward_stages=5), "more groups than the 3 layers"),
        (dict(num_layers=4, last_layers=5), "last_layers=5 is more than num_layers=4"),
        (dict(num_layers=0), "num_layers must be an integer >= 1"),
        (dict(num_layers=4, backward_stages=[1, 0, 2]), "backward_stages entry must be an integer >= 1"),
        (dict(num_layers=2, last_layers=2, forward_stages=1), "no layers are left"),
    ],
)
def test_bad_options_say_what_to_change(options, message):
    with pytest.raises(ValueError, match=message):
        generate("roundrobin", num_ranks=2, num_microbatches=2, **options)


def _edited(schedule, worker, position, replacement):
    rows = [list(r) for r in schedule.actions]
    rows[worker][position:position + 1] = replacement
    return schedule.replace(actions=rows)


def test_validator_catches_broken_jobs():
    schedule = generate("roundrobin", **SMALL)
    moved = _edited(schedule, 0, 2, [])  # 0F1 off device 0 ...
    moved = _edited(moved, 1, 0, [Action(1, Kind.LOAD), Action(0, Kind.F, 1)])  # ... onto device 1
    with pytest.raises(ValueError, match="job 0 needs exactly one LOAD on device 1"):  # a split job loads on each
        validate(moved)
    validate(_edited(moved, 1, 0, [Action(0, Kind.LOAD), Action(1, Kind.LOAD)]))  # then the split is valid
    half = _edited(schedule, 0, 7, [])  # 2R1 off device 0, onto device 1 while its 2B1 stays
    half = _edited(half, 1, 0, [Action(1, Kind.LOAD), Action(2, Kind.LOAD), Action(2, Kind.R, 1), Action(2, Kind.STORE)])
    with pytest.raises(ValueError, match=r"micro-batch 1 of backward job 2 runs on devices \[0, 1\]"):
        validate(half)
    no_store = _edited(schedule, 1, 7, [])
    assert str(schedule.actions[1][7]) == "1STORE"
    with pytest.raises(ValueError, match="last job 1 needs exactly one STORE"):
        validate(no_store)
    with pytest.raises(ValueError, match="has 0 of 2R1"):
        validate(_edited(schedule, 0, 7, []))
    with pytest.raises(ValueError, match="needs meta.forward_layers"):
        validate(schedule.replace(meta={}))
    with pytest.raises(ValueError, match="0I0 has no meaning in a round-robin pool"):  # forward jobs keep no graph
        validate(_edited(schedule, 0, 6, [Action(0, Kind.I, 0), Action(0, Kind.W, 0)]))
    with pytest.raises(ValueError, match=r"or I and W once each instead"):  # a B split only halfway
        validate(_edited(schedule, 0, 6, [Action(2, Kind.I, 0)]))


def test_memory_rows_are_memory_delta_per_action():
    from bubbleless_schedules.layouts import layout_of

    layer_costs = Costs([1.0] * 12 + [2.0], [1.0] * 13, [1.0] * 13, 0.1)
    for split in (False, True):
        schedule = generate("roundrobin", num_ranks=4, num_microbatches=6, layer_costs=layer_costs,
                            split_backward=split)
        layout = layout_of(schedule)
        for frees in (0.0, 0.4):
            assert layout.memory_rows(schedule, frees) == [
                [layout.memory_delta(a, schedule, frees) for a in row] for row in schedule.actions]


def test_roundrobin_per_layer_costs_given_to_simulate_name_job_costs():
    from bubbleless_schedules import Costs, generate, job_costs, pool_groups, simulate

    layer_costs = Costs(tuple([1.0] * 12), tuple([2.0] * 12), tuple([0.5] * 12), 0.0)
    schedule = generate("roundrobin", num_ranks=2, num_microbatches=4, layer_costs=layer_costs)
    groups = pool_groups(schedule)
    assert groups.num_stages != groups.num_layers == 12
    with pytest.raises(ValueError, match=r"12 per-layer values but this round-robin schedule's stages are its "
                                         r"\d+ jobs: pass job_costs\(layer_costs, pool_groups\(schedule\)\)"):
        simulate(schedule, layer_costs)
    assert simulate(schedule, job_costs(layer_costs, groups)).makespan > 0
