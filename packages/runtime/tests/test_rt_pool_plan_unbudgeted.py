"""The pool's automatic plan without a memory budget is at least as fast as under any budget: no budget
is the budget every layer fits in (``pool_plan_cap.generated_within``), not the generator's own plan alone."""

from __future__ import annotations

import pytest

from bubbleless_partition import LayerCost, Profile
from bubbleless_runtime import pool_plan
from bubbleless_schedules import simulate


def _layer(name, forward, input_grad, weight_grad, param_bytes, activation, output) -> LayerCost:
    return LayerCost(name=name, forward=forward, input_grad=input_grad, weight_grad=weight_grad, recompute=forward,
                     param_bytes=param_bytes, activation_bytes_per_token=activation, output_bytes_per_token=output)


TINY_BENCH = Profile(
    layers=(_layer("embed", 0.031, 0.0, 0.469, 2_097_152, 8, 1024),
            *(_layer(f"layers.{i}", 4.044, 5.560, 3.584, 3_409_920, 17_408, 1024) for i in range(6)),
            _layer("lm_head", 2.262, 2.464, 2.206, 2_098_176, 9216, 4)),
    tokens_per_microbatch=256, host_bandwidth=3.89, extra={pool_plan.COPY_BANDWIDTH: 3.89})
"""bench/measured/rr_plan.py's profile of the tiny scenario (its cost model's ms and bytes, rounded): the
generator's own plan there is 5 one-layer groups a side with a fused 3 (424 ms simulated), the plan a
budget also tries (the most layers that fit) 1 a side with a fused 7 (361 ms)."""

PLAN = dict(num_devices=2, num_microbatches=8, name="roundrobin", options={}, bandwidth=3.89)


def _makespan(memory_cap) -> float:
    _, schedule, costs = pool_plan.auto_groups(TINY_BENCH, memory_cap=memory_cap, **PLAN)
    return simulate(schedule, costs).makespan


@pytest.mark.parametrize("memory_cap", [1e30, 1e10, 1e8])
def test_rt_pool_plan_without_a_budget_is_no_slower_than_under_one_that_does_not_bind(memory_cap):
    assert _makespan(None) <= _makespan(memory_cap) * (1 + 1e-12)


def test_rt_pool_plan_without_a_budget_keeps_the_faster_plan_of_the_most_layers():
    groups, _, _ = pool_plan.auto_groups(TINY_BENCH, memory_cap=None, **PLAN)
    assert (groups.forward, groups.last, groups.backward) == ((1,), 7, (1,))
