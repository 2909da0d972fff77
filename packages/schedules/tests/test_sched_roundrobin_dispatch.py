"""``roundrobin`` with per-layer costs against an independent RoundPipe dispatch, and the steady state."""

import sys
from pathlib import Path

import pytest

from bubbleless_schedules import Costs, generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups
from bubbleless_schedules.simulate import peak_memory
from bubbleless_schedules.simulate_steady import steady_state

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.schedules import roundpipe_reference as rp  # noqa: E402


def profile(layers: int, head: float, backward: float, comm: float = 0.1) -> Costs:
    """RoundPipe-like: F 1 per layer, B ``backward`` x F split evenly into I and W, the head last."""
    half = backward / 2
    return Costs([1.0] * layers + [head], [half] * layers + [head], [half] * layers + [head], comm)


SMALL = {"8 layers, 4 devices": (profile(8, 2.0, 2.2), 4, 8), "12 layers, 4 devices": (profile(12, 3.0, 2.6), 4, 6),
         "6 layers, 2 devices": (profile(6, 1.5, 3.0), 2, 5), "16 layers, 8 devices": (profile(16, 2.4, 2.3), 8, 8)}


def test_reference_recurrence_equals_the_shared_simulator():
    layer_costs = profile(12, 3.0, 2.6)
    result = rp.roundpipe(layer_costs, num_devices=4, num_microbatches=10)  # two full rounds and one of 2
    validate(result.schedule)
    assert simulate(result.schedule, result.costs).makespan == pytest.approx(result.makespan)
    assert result.schedule.meta["round_size"] == (4,)


def test_reference_cut_fuses_the_head_and_packs_three_times_the_forward_layers():
    groups = rp.roundpipe_cut(profile(12, 3.0, 2.0, comm=0.0), cap=9.0)  # head F+B = 9, R+B per layer 3
    assert groups.last == 1 and groups.backward == (3, 3, 3, 3) and groups.forward == (9, 3)


@pytest.mark.parametrize("case", list(SMALL))
def test_ours_is_no_slower_than_roundpipe_dispatch_on_small_profiles(case):
    layer_costs, devices, microbatches = SMALL[case]
    ours = generate("roundrobin", num_ranks=devices, num_microbatches=microbatches, layer_costs=layer_costs)
    ours_span = simulate(ours, job_costs(layer_costs, pool_groups(ours))).makespan
    # RoundPipe over its own partitioner's cuts and over our cut: the comparison isolates the dispatch too
    theirs = rp.roundpipe(layer_costs, num_devices=devices, num_microbatches=microbatches,
                          extra_cuts=[pool_groups(ours)])
    assert ours_span <= theirs.makespan + 1e-9, (ours_span, theirs.makespan)


def test_pinned_cut_and_recompute_ahead_one_is_roundpipes_order_in_one_round():
    layer_costs = profile(8, 2.0, 2.2)
    pinned = {"forward_stages": [4, 4], "last_layers": 1, "backward_stages": [2, 2, 2, 2]}
    ours = generate("roundrobin", num_ranks=4, num_microbatches=4, layer_costs=layer_costs, recompute_ahead=1,
                    weight_transfers=False, **pinned)
    assert pool_groups(ours) == PoolGroups((4, 4), 1, (2, 2, 2, 2))
    theirs = rp.dispatch(pool_groups(ours), rp.job_costs(layer_costs, pool_groups(ours)), num_devices=4,
                         num_microbatches=4)
    assert simulate(ours, job_costs(layer_costs, pool_groups(ours))).makespan <= theirs.makespan + 1e-9
    assert max(peak_memory(ours)) <= max(peak_memory(theirs.schedule)) + 1e-9  # one micro-batch held at a time


def test_memory_limit_bounds_the_recompute_look_ahead():
    layer_costs = profile(8, 2.0, 2.2)
    free = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs, recompute_ahead=2)
    capped = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs, memory_limit=1.0)
    assert max(peak_memory(capped)) <= 1.0 + 1e-9
    assert max(peak_memory(free)) > 0
    with pytest.raises(ValueError, match="memory_limit=0.1"):
        generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs, memory_limit=0.1)


@pytest.mark.parametrize("kwargs, message", [
    ({"layer_costs": Costs([1.0] * 4, [1.0] * 3, [1.0] * 4)}, "differ in length"),
    ({"layer_costs": Costs(1.0, 1.0, 1.0)}, "one value per layer"),
    ({"layer_costs": Costs([1.0] * 4, 1.0, 1.0), "num_layers": 5}, "num_layers=5"),
    ({"layer_costs": Costs([1.0] * 4, 1.0, 1.0), "recompute_ahead": 0}, "recompute_ahead"),
    ({"recompute_ahead": 2}, "needs layer_costs"),
    ({"layer_costs": Costs([1.0] * 4, 1.0, 1.0), "backward_stages": [1, 1], "last_layers": 1}, "covers 2 layers"),
])
def test_layer_cost_errors_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate("roundrobin", num_ranks=2, num_microbatches=2, **kwargs)


def test_steady_state_overlaps_iterations_and_is_below_single_bubble():
    layer_costs = profile(12, 3.0, 2.6)
    ours = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs)
    costs = job_costs(layer_costs, pool_groups(ours))
    state = steady_state(ours, costs, iterations=4)
    assert state.makespan == pytest.approx(simulate(ours, costs).makespan)
    assert state.period < state.makespan  # the next iteration fills this one's drain
    assert state.steady_bubble < state.bubble
    work = sum(s.end - s.start for s in simulate(ours, costs).spans)
    assert state.period >= work / 4 - 1e-9  # never faster than the devices' work allows


def test_steady_state_of_a_stage_bound_schedule_and_bad_iterations():
    schedule = generate("1f1b", num_ranks=4, num_microbatches=8)
    state = steady_state(schedule)
    assert state.shift == 0 and state.period <= state.makespan + 1e-9
    with pytest.raises(ValueError, match="iterations must be an integer >= 2"):
        steady_state(schedule, iterations=1)


def test_round_size_layout_refuses_a_round_split_over_devices():
    result = rp.roundpipe(profile(8, 2.0, 2.2), num_devices=4, num_microbatches=8)
    rows = [list(row) for row in result.schedule.actions]
    moved = next(a for a in rows[0] if a.microbatch == 1)  # one micro-batch of a round-0 job elsewhere
    rows[0].remove(moved)
    rows[1].append(moved)
    with pytest.raises(ValueError, match="runs on devices"):
        validate(result.schedule.replace(actions=rows))


def _kinds(schedule) -> set[str]:
    return {a.kind.value for _, _, a in schedule.all_actions()}


def test_split_backward_emits_i_and_w_when_asked_and_w_fills_waits():
    layer_costs = profile(12, 3.0, 2.6)
    plain = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs, split_backward=False)
    split = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs, split_backward=True)
    assert {"I", "W"} <= _kinds(split) and "B" not in _kinds(split)
    assert not {"I", "W"} & _kinds(plain)  # False opts out
    spans = [simulate(s, job_costs(layer_costs, pool_groups(s))).makespan for s in (plain, split)]
    assert spans[1] < spans[0]  # W off the critical path shortens this profile's drain
    row = next(r for r in split.actions if any(a.kind.value == "W" for a in r))
    first_w = next(i for i, a in enumerate(row) if a.kind.value == "W")
    assert any(a.kind.value == "I" for a in row[first_w + 1:])  # some W runs before a later I: deferred


def test_split_backward_default_keeps_the_faster_of_b_and_i_w(monkeypatch):
    """Left at its default, the split is chosen where it simulates faster than B (this profile's drain),
    and B where it does not: with no weight-gradient work, W fills nothing and B wins the tie. The B
    search leaves budget here, so a whole I/W search follows it and may find a faster cut than B's."""
    layer_costs = profile(12, 3.0, 2.6)
    runs = {option: generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs,
                             split_backward=option) for option in (None, False)}
    monkeypatch.setattr(roundrobin_search, "LEFTOVER_SEARCH", float("inf"))  # no I/W search after B
    runs["seeded"] = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs)
    spans = {option: simulate(s, job_costs(layer_costs, pool_groups(s))).makespan for option, s in runs.items()}
    assert {"I", "W"} <= _kinds(runs["seeded"]) and "B" not in _kinds(runs["seeded"])
    assert spans[None] <= spans["seeded"] < spans[False], spans
    assert pool_groups(runs["seeded"]) == pool_groups(runs[False])  # B's winning cut, its backward split
    # with no weight-gradient work W fills nothing: I/W is kept only where the plan it comes with (the
    # split re-dispatch tries look-aheads the B ranking left out) simulates strictly faster than B's
    no_weight_work = Costs([1.0] * 12 + [3.0], [2.6] * 12 + [3.0], [0.0] * 13, 0.1)
    default, fused = (generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=no_weight_work,
                               split_backward=option) for option in (None, False))
    default_span, fused_span = (simulate(s, job_costs(no_weight_work, pool_groups(s))).makespan
                                for s in (default, fused))
    assert default_span <= fused_span
    if {"I", "W"} & _kinds(default):
        assert default_span < fused_span - 1e-9
    assert not {"I", "W"} & _kinds(generate("roundrobin", num_ranks=4, num_microbatches=8))  # no layer costs: B


def test_load_stream_overlaps_uploads_with_the_previous_jobs_compute():
    costs = profile(12, 3.0, 2.6)
    loads = Costs(costs.forward, costs.backward_input, costs.backward_weight, costs.comm,
                  load=[2.0] * 13, store=[1.0] * 13)
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=loads)
    job = job_costs(loads, pool_groups(schedule))
    in_order = steady_state(schedule, job)
    streamed = steady_state(schedule, job, load_stream=True)
    assert in_order.makespan == pytest.approx(simulate(schedule, job).makespan)
    assert streamed.makespan < in_order.makespan
    no_loads = Costs(costs.forward, costs.backward_input, costs.backward_weight, costs.comm)
    assert streamed.makespan >= simulate(schedule, job_costs(no_loads, pool_groups(schedule))).makespan - 1e-9
    huge = Costs(costs.forward, costs.backward_input, costs.backward_weight, costs.comm, load=[500.0] * 13)
    bounded = steady_state(schedule, job_costs(huge, pool_groups(schedule)), load_stream=True)
    jobs_per_device = max(len({a.stage for a in row}) for row in schedule.actions)
    # one copy stream per device: its uploads run one after another
    assert bounded.makespan >= 500.0 * jobs_per_device
    with pytest.raises(ValueError, match="load_stream=True models the round-robin pool"):
        steady_state(generate("1f1b", num_ranks=2, num_microbatches=2), load_stream=True)


def test_next_job_recompute_fills_waits_within_its_own_slots():
    from bubbleless_schedules.generators.roundrobin_search import dispatched

    layer_costs = profile(12, 3.0, 2.6)
    groups = PoolGroups((4, 4, 4), 1, (1, 1, 2, 2, 2, 2, 2))
    runs = {n: dispatched(groups, layer_costs, num_devices=4, num_microbatches=8, ahead=1, next_ahead=n)
            for n in (0, 8)}
    plain, early = (runs[n][0] for n in (0, 8))
    assert simulate(early, runs[8][1]).makespan <= simulate(plain, runs[0][1]).makespan
    # some device recomputes a later job while an earlier one still has backwards to run
    assert any(a.kind.value == "R" and any(b.kind.value == "B" and b.stage < a.stage for b in row[i + 1:])
               for row in early.actions for i, a in enumerate(row))
    assert max(peak_memory(early)) > max(peak_memory(plain))  # the price: the next job's activations


def test_a_paced_forward_job_recomputes_its_devices_next_job_in_its_waits():
    from bubbleless_schedules.generators.roundrobin_search import dispatched

    # forward job 1 (one layer) is paced by job 0 (four layers) upstream: it waits 4 of every 5 units;
    # device 1's next job (3: the top backward group) reads layer 5's input, which job 1 itself makes
    layer_costs = profile(8, 2.0, 2.2, comm=0.0)
    groups = PoolGroups((4, 3), 1, (2, 2, 3))
    ours, costs, _ = dispatched(groups, layer_costs, num_devices=2, num_microbatches=6, ahead=1, next_ahead=6,
                                weight_transfers=False)
    validate(ours)
    row = ours.actions[1]
    last_forward = max(i for i, a in enumerate(row) if a.stage == 1)
    assert any(a.stage == 3 and a.kind.value == "R" for a in row[:last_forward])
    plain, plain_costs, _ = dispatched(groups, layer_costs, num_devices=2, num_microbatches=6, ahead=1,
                                       weight_transfers=False)
    assert simulate(ours, costs).makespan < simulate(plain, plain_costs).makespan
    assert simulate(ours, costs).makespan >= sum(s.end - s.start for s in simulate(ours, costs).spans) / 2
