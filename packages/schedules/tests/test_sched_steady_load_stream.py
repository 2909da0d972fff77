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
