"""``steady_state``'s first-free placements: iteration k + 1's rows go, in the order one iteration starts their
first compute, to the devices in the order they end iteration k. A fixed rotation cannot follow which device
frees first (it depends on the rows each device ran before), so on a pool schedule the rule can beat every
shift; the default keeps the shorter period of both, and stage-bound schedules keep their ranks."""

import pytest

from bubbleless_schedules import Costs, generate, simulate
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups
from bubbleless_schedules.schedule import Schedule
from bubbleless_schedules.simulate_steady import _Run, first_free_placements, steady_state


def test_first_free_deals_rows_in_start_order_to_devices_in_free_order():
    # one iteration alone starts row 2's compute first, then rows 0 and 1 (a tie: the lower row first)
    first_compute = [5.0, 5.0, 1.0]
    frees = [[9.0, 7.0, 8.0], [20.0, 21.0, 19.0]]  # per iteration: when each device ends it

    def run(placements):
        count = len(placements)
        return _Run([0.0] * count, frees[:count], [first_compute] * count)

    placements = first_free_placements(run, 3, 3)
    # iteration 1: devices free in the order 1, 2, 0 -> row 2 on device 1, row 0 on device 2, row 1 on device 0
    # iteration 2: devices free in the order 2, 0, 1 -> row 2 on device 2, row 0 on device 0, row 1 on device 1
    assert placements == [(0, 1, 2), (2, 0, 1), (0, 1, 2)]


# A plan of the roundrobin generator, kept as text so that this file tests the placement rule, not the search:
# B and R about 2.1x F, as RoundPipe-like profiles, cut (3,) / 6 / (1, 1, 1) with its fill splits. The generator
# made it before the re-cut of the grown fused group (evened_forward, c517d84) and before its idle check ran
# four iterations back to back (it now returns (2, 2) / 5 / (1, 1, 2), on which the rule ties a shift at 113.9).
POOL_PLAN = """\
# bubbleless-schedule name=roundrobin stages=5 microbatches=8 layout=roundrobin meta.forward_layers=3 meta.last_layers=6 meta.backward_layers=1,1,1
0LOAD,0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,2LOAD,2R0,2I0,2R4,2W0,2I4,2W4,2R1,2I1,2R5,2I5,2W1,2W5,2R2,2I2,2R6,2I6,2W2,2W6,2R3,2I3,2R7,2I7,2W3,2W7,2STORE,3LOAD,3R1,3I1,3R5,3I5,3W1,3W5,3R3,3I3,3R7,3I7,3W3,3W7,3STORE,4LOAD,4R1,4I1,4R5,4I5,4W1,4W5,4STORE
1LOAD,1F0,1I0,1F3,1I3,1F6,1I6,1W0,1W3,1W6,1STORE,4LOAD,4R2,4I2,4R6,4I6,4W2,4W6,4STORE
1LOAD,1F1,1I1,1F4,1I4,1F7,1I7,1W1,1W4,1W7,1STORE
1LOAD,1F2,1I2,1F5,1I5,1W2,1W5,1STORE,3LOAD,3R0,3I0,3R4,3I4,3W0,3W4,3R2,3I2,3R6,3I6,3W2,3W6,3STORE,4LOAD,4R0,4I0,4R4,4I4,4W0,4W4,4R3,4I3,4R7,4I7,4W3,4W7,4STORE
"""
LAYER_COSTS = Costs([1.0] * 8 + [3.0], [2.1] * 8 + [3.0], [2.1] * 8 + [3.0], 0.1)


def pool_schedule():
    schedule = Schedule.from_csv(POOL_PLAN)
    assert pool_groups(schedule) == PoolGroups(forward=(3,), last=6, backward=(1, 1, 1))
    return schedule, job_costs(LAYER_COSTS, pool_groups(schedule))


def test_first_free_beats_every_fixed_shift_and_the_default_keeps_it():
    schedule, costs = pool_schedule()
    shifts = [steady_state(schedule, costs, rotate=s) for s in range(4)]
    first_free = steady_state(schedule, costs, rotate=True)
    assert first_free.shift is None
    assert first_free.period < min(s.period for s in shifts) - 1e-6
    default = steady_state(schedule, costs)
    assert default.period == pytest.approx(first_free.period) and default.shift is None
    assert default.placements == first_free.placements
    assert default.placements[0] == (0, 1, 2, 3)
    assert all(sorted(p) == [0, 1, 2, 3] for p in default.placements)  # every row on a device of its own
    work = sum(s.end - s.start for s in simulate(schedule, costs).spans)
    assert default.period >= work / 4 - 1e-9  # never faster than the devices' work allows


def test_a_fixed_shift_reports_its_rotation():
    schedule, costs = pool_schedule()
    state = steady_state(schedule, costs, rotate=1, iterations=3)
    assert state.shift == 1 and state.placements == ((0, 1, 2, 3), (1, 2, 3, 0), (2, 3, 0, 1))


def test_a_stage_bound_schedule_keeps_its_ranks():
    state = steady_state(generate("1f1b", num_ranks=4, num_microbatches=8))
    assert state.shift == 0 and set(state.placements) == {(0, 1, 2, 3)}


@pytest.mark.parametrize("rotate", [True, 1, 3])
def test_re_placing_a_stage_bound_schedule_is_refused(rotate):
    with pytest.raises(ValueError, match="pins its stages to ranks"):
        steady_state(generate("1f1b", num_ranks=4, num_microbatches=8), rotate=rotate)
    assert steady_state(generate("1f1b", num_ranks=4, num_microbatches=8), rotate=0).shift == 0


@pytest.mark.parametrize("rotate", [1.7, "x"])
def test_a_rotation_that_is_not_a_shift_is_refused(rotate):
    schedule, costs = pool_schedule()
    with pytest.raises(ValueError, match="rotate must be None"):
        steady_state(schedule, costs, rotate=rotate)


def test_pool_steady_state_is_first_free_with_two_in_flight():
    from bubbleless_schedules import generate
    from bubbleless_schedules.simulate_steady import pool_steady_state, steady_state

    schedule = generate("roundrobin", num_ranks=4, num_microbatches=4, forward_stages=3, backward_stages=5)
    pool = pool_steady_state(schedule)
    assert pool.shift is None  # first free, never a fixed shift
    assert pool.period == steady_state(schedule, rotate=True, max_in_flight=2).period
    assert pool.period >= steady_state(schedule).period - 1e-9  # no better than the best rule, unbounded
