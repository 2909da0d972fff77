"""``steady_state(load_stream=True)``'s weight budget: a job's weights go when its last action on the device
ends, so a device that ends a later-started job first (a split backward's deferred W) loads its next job
into the room that job leaves, as the pool does, instead of waiting for the earlier job (a deadlock)."""

import pytest

from bubbleless_schedules import Costs, Schedule, generate, simulate, validate
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.roundrobin_layout import pool_groups
from bubbleless_schedules.simulate_steady import steady_state

# jobs: 0 = F layers 0-1, 1 = the last layer 2, 2 = R/I/W layer 1, 3 = R/I/W layer 0. Job 1 starts before
# jobs 2 and 3 and ends last (its W deferred to the end); 3LOAD finds jobs 1 and 2 loaded and 2 ended.
LATER_ENDS_FIRST = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=4 microbatches=1 layout=roundrobin "
    "meta.forward_layers=2 meta.last_layers=1 meta.backward_layers=1,1\n"
    "0LOAD 0F0 1LOAD 1F0 1I0 2LOAD 2R0 2I0 2W0 2STORE 3LOAD 3R0 3I0 3W0 3STORE 1W0 1STORE\n")


def test_steady_load_stream_loads_into_the_room_a_later_started_job_leaves():
    validate(LATER_ENDS_FIRST)
    costs = Costs([1.0] * 4, [1.0] * 4, [1.0] * 4, 0.0, load=[1.0] * 4, store=[0.5] * 4)
    result = steady_state(LATER_ENDS_FIRST, costs, load_stream=True)
    # computes 0F0 1-2, 1F0 1I0 to 4, job 2 (loaded 2-3 once job 0 ended) 4-7.5 with its STORE, then
    # 3LOAD 7.5-8.5, job 3 to 12, 1W0 1STORE to 13.5
    assert result.makespan == pytest.approx(13.5)
    assert result.makespan < simulate(LATER_ENDS_FIRST, costs).makespan  # LOADs in the compute order: 15.5


def test_steady_load_stream_simulates_split_backward_orders_that_end_jobs_out_of_order():
    """A generated I/W order where device 2 starts job 8 before job 5 and ends it after job 11 started."""
    layer_costs = Costs([1.0] * 12 + [3.0], [1.1] * 12 + [3.0], [1.1] * 12 + [3.0], 0.1, load=[0.5] * 13,
                        store=[0.25] * 13)
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=3, layer_costs=layer_costs, split_backward=True)
    stages = [[a.stage for a in row] for row in schedule.actions]
    ends = [{job: max(i for i, s in enumerate(row) if s == job) for job in row} for row in stages]
    starts = [{job: row.index(job) for job in row} for row in stages]
    assert any(starts[d][a] < starts[d][b] and ends[d][a] > ends[d][b] for d in range(3) for a in ends[d]
               for b in ends[d]), schedule.render()
    costs = job_costs(layer_costs, pool_groups(schedule))
    streamed = steady_state(schedule, costs, load_stream=True)
    no_loads = Costs(layer_costs.forward, layer_costs.backward_input, layer_costs.backward_weight, layer_costs.comm)
    assert simulate(schedule, job_costs(no_loads, pool_groups(schedule))).makespan <= streamed.makespan + 1e-9
    assert streamed.makespan <= steady_state(schedule, costs).makespan + 1e-9


def test_without_cross_iteration_prefetch_the_first_load_of_an_iteration_waits_for_the_device_to_free():
    costs = Costs([1.0] * 4, [1.0] * 4, [1.0] * 4, 0.0, load=[1.0] * 4, store=[0.5] * 4)
    # iteration 1's 0LOAD fits into the room job 3 leaves at 12, under 1W0 1STORE (12-13.5): the next
    # iteration's 0F0 starts as the device frees, 13.5 = 1 + 12.5. Held until the device frees, the LOAD runs
    # 13.5-14.5 and every iteration starts one LOAD later.
    prefetched = steady_state(LATER_ENDS_FIRST, costs, load_stream=True)
    held = steady_state(LATER_ENDS_FIRST, costs, load_stream=True, cross_iteration_prefetch=False)
    assert prefetched.period == pytest.approx(12.5)
    assert held.period == pytest.approx(13.5)
    assert held.makespan == prefetched.makespan == pytest.approx(13.5)  # one iteration alone: nothing to hold
    assert steady_state(LATER_ENDS_FIRST, costs, load_stream=True, cross_iteration_prefetch=True) == prefetched


def pool_schedule_with_loads():
    layer_costs = Costs([1.0] * 8 + [3.0], [1.1] * 8 + [3.0], [1.1] * 8 + [3.0], 0.1, load=[0.8] * 9,
                        store=[0.4] * 9)
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=8, layer_costs=layer_costs)
    return schedule, job_costs(layer_costs, pool_groups(schedule))


@pytest.mark.parametrize("rotate", [None, True, 1])
def test_holding_the_first_load_never_shortens_the_period_and_the_default_prefetches(rotate):
    schedule, costs = pool_schedule_with_loads()
    default = steady_state(schedule, costs, rotate=rotate, load_stream=True)
    prefetched = steady_state(schedule, costs, rotate=rotate, load_stream=True, cross_iteration_prefetch=True)
    held = steady_state(schedule, costs, rotate=rotate, load_stream=True, cross_iteration_prefetch=False)
    assert default == prefetched
    assert held.makespan == pytest.approx(prefetched.makespan)
    assert held.period > prefetched.period + 1.0  # 82.5-83.9 against 80.6-82.3: the hold is on the critical path
    assert held.period <= prefetched.makespan + 1e-9  # still overlaps: never slower than steps one by one


def test_without_load_stream_every_load_already_waits_in_the_compute_order():
    schedule, costs = pool_schedule_with_loads()
    assert (steady_state(schedule, costs, rotate=True, cross_iteration_prefetch=False)
            == steady_state(schedule, costs, rotate=True))


@pytest.mark.parametrize("bad", [0, "no", None])
def test_cross_iteration_prefetch_must_be_a_bool(bad):
    schedule, costs = pool_schedule_with_loads()
    with pytest.raises(ValueError, match="cross_iteration_prefetch must be True or False"):
        steady_state(schedule, costs, load_stream=True, cross_iteration_prefetch=bad)


@pytest.mark.parametrize("prefetch", [True, False])
def test_one_iteration_in_flight_runs_them_one_after_another(prefetch):
    schedule, costs = pool_schedule_with_loads()
    alone = steady_state(schedule, costs, rotate=True, load_stream=True, cross_iteration_prefetch=prefetch,
                         max_in_flight=1)
    assert alone.period == pytest.approx(alone.makespan)  # every iteration starts on idle devices


# device 0's row (18.5 long) ends every iteration; the other two are short, so the device that ran one of them
# in iteration k + 1 is free for iteration k + 2 while iteration k's long row still runs.
ONE_LONG_ROW = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=3 microbatches=3 layout=roundrobin "
    "meta.forward_layers=1 meta.last_layers=1 meta.backward_layers=1\n"
    "0LOAD 0F0 0F1 0F2 1LOAD 1F2 1B2 1STORE 2LOAD 2R2 2B2 2R0 2B0 2R1 2B1 2STORE\n"
    "1LOAD 1F0 1B0 1STORE\n"
    "1LOAD 1F1 1B1 1STORE\n")


def test_two_iterations_in_flight_hold_the_third_until_the_first_has_ended():
    validate(ONE_LONG_ROW)
    costs = Costs([1.0] * 3, [1.0, 1.0, 3.0], [0.0] * 3, 0.0, load=[0.5] * 3, store=[0.5] * 3, recompute=[1.0] * 3)

    def state(in_flight):
        return steady_state(ONE_LONG_ROW, costs, iterations=8, rotate=True, load_stream=True,
                            cross_iteration_prefetch=False, max_in_flight=in_flight)

    unbounded = state(None)
    # unbounded, the ends repeat every 3 iterations (18.5, 24.5, 31.5, 43.0, 49.0, 56.0, 67.5, 73.5: 24.5 per 3);
    # held to 2 in flight, every 2 (18.5, 24.5, 37.0, 43.0, ...: 18.5 per 2). The period from iteration 1 over
    # 6 ends gives both exactly (the mean over all 7 gave 55 / 7 and 61.5 / 7, half a cycle off)
    assert unbounded.makespan == pytest.approx(18.5) and unbounded.period == pytest.approx(24.5 / 3)
    assert state(3) == unbounded  # about 2.4 iterations run at once
    assert state(2).period == pytest.approx(18.5 / 2)  # held: iteration k + 2 starts as iteration k ends
    assert state(2).makespan == unbounded.makespan


def test_waiting_for_another_device_to_end_an_iteration_costs_no_comm():
    costs = Costs([1.0] * 3, [1.0, 1.0, 3.0], [0.0] * 3, 0.25, load=[0.5] * 3, store=[0.5] * 3, recompute=[1.0] * 3)
    one = steady_state(ONE_LONG_ROW, costs, rotate=True, load_stream=True, cross_iteration_prefetch=False,
                       max_in_flight=1)
    assert one.placements[1][0] != one.placements[0][0]  # the long row moves: its next device waits for another
    assert one.period == pytest.approx(one.makespan)  # the next iteration starts as the last device ends


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_in_flight_must_be_a_positive_int(bad):
    schedule, costs = pool_schedule_with_loads()
    with pytest.raises(ValueError, match="max_in_flight must be None"):
        steady_state(schedule, costs, load_stream=True, max_in_flight=bad)
