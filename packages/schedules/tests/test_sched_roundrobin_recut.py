"""``roundrobin_search``'s grown branch re-cut: the grown plan's forward groups evened into one more
(``evened_forward``) under each fill split and drain split, kept when faster and no idler back to back."""

from bench.schedules import roundpipe_reference as rp
from bubbleless_schedules import generate, validate
from bubbleless_schedules.generators import roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.generators.roundrobin_search import evened_forward, filled, other_drains
from bubbleless_schedules.roundrobin_layout import PoolGroups, held_weights, pool_groups
from bubbleless_schedules.simulate import peak_memory
from bubbleless_schedules.simulate_steady import pool_steady_state

from .test_sched_roundrobin_grown import llama_8b_32, makespan


def test_evened_forward_spreads_the_body_over_one_more_group_the_smaller_first():
    groups = PoolGroups((2, 5, 5, 5, 5, 5, 4), 2, (1,) * 31)
    assert evened_forward(groups, 8) == PoolGroups((3, 4, 4, 4, 4, 4, 4, 4), 2, (1,) * 31)
    assert evened_forward(groups, 7) == PoolGroups((4, 4, 4, 4, 5, 5, 5), 2, (1,) * 31)
    assert evened_forward(PoolGroups((1, 1), 1, (2,)), 3) is None  # more groups than body layers


def test_fill_and_drain_variants_keep_the_rest_of_the_split():
    fused, drain = ("last", "interleaved", 2), ("tail", 8, 4)
    assert filled((fused, drain), 8) == [(fused, drain, ("fill", 2, 4)), (fused, drain, ("fill", 4, 2)),
                                         (fused, drain, ("fill", 8, 2))]
    assert filled((fused,), 2) == [(fused, ("fill", 4, 2)), (fused, ("fill", 8, 2))]  # (2, 4) needs 4 devices
    assert other_drains((fused, ("fill", 2, 4), drain), 8) == [(fused, ("fill", 2, 4), ("tail", 1, 2))]
    assert other_drains((fused,), 8) == [(fused, ("tail", 1, 2)), (fused, ("tail", 8, 4))]


def test_the_recut_brings_llama_8b_at_32_micro_batches_within_the_goal_and_roundpipes_memory(monkeypatch):
    layer_costs, limits = llama_8b_32()
    ours = generate("roundrobin", num_ranks=8, num_microbatches=32, layer_costs=layer_costs, **limits)
    validate(ours)
    costs = job_costs(layer_costs, pool_groups(ours))
    assert held_weights(ours)[0] <= 2 and held_weights(ours)[1] <= limits["weight_limit"]
    assert max(peak_memory(ours)) <= limits["memory_limit"] + 1e-9
    theirs = rp.roundpipe(layer_costs, num_devices=8, num_microbatches=32, extra_cuts=[pool_groups(ours)])
    assert makespan(ours, layer_costs) <= 0.95 * theirs.makespan  # 597.3 against 636.3 (0.939)
    assert pool_steady_state(ours, costs).steady_bubble < 0.03  # 0.016
    monkeypatch.setattr(roundrobin_search, "evened_forward", lambda groups, count: None)
    without = generate("roundrobin", num_ranks=8, num_microbatches=32, layer_costs=layer_costs, **limits)
    assert makespan(ours, layer_costs) < makespan(without, layer_costs) - 5.0  # 597.3 against 609.0
