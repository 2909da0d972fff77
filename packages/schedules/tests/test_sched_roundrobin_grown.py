"""``roundrobin_search``'s second grown source: the best plan whose only job split is its fused group's,
grown by one layer under the same split and its drain split, in a branch of its own (``grown_sources``)."""

from bench.schedules import roundpipe_reference as rp
from bench.schedules.roundpipe_profiles import profiles
from bench.schedules.roundrobin_table import rp_memory
from bubbleless_schedules import generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.generators.roundrobin_search import grown_sources, one_layer_more
from bubbleless_schedules.roundrobin_layout import PoolGroups, held_weights, pool_groups


def entry(split_job):
    return (100.0, 0, (1, 0, split_job), None, None)


def test_a_best_plan_split_only_at_its_fused_group_is_a_second_source():
    unsplit = entry(())
    fused = entry((("last", "interleaved", 2),))
    assert grown_sources(fused, unsplit) == [unsplit, fused]
    assert grown_sources(unsplit, unsplit) == [unsplit]
    assert grown_sources(entry((("last", "interleaved", 2), ("tail", 8, 4))), unsplit) == [unsplit]
    assert grown_sources(entry((3, "halves")), unsplit) == [unsplit]


def test_one_layer_more_moves_the_body_top_layer_into_the_fused_group_within_the_weight_cap():
    groups = PoolGroups((2, 5), 1, (3, 4))
    assert one_layer_more(groups, None) == PoolGroups((2, 4), 2, (3, 3))
    assert one_layer_more(groups, 1) is None
    assert one_layer_more(PoolGroups((1,), 1, (1,)), None) is None


def llama_8b_32():
    layer_costs = profiles()["llama-3.1-8b"]
    limits = rp_memory(rp.roundpipe(layer_costs, num_devices=8, num_microbatches=32).schedule)
    return layer_costs, limits


def makespan(schedule, layer_costs):
    return simulate(schedule, job_costs(layer_costs, pool_groups(schedule))).makespan


def test_the_second_source_shortens_llama_8b_at_32_micro_batches_within_roundpipes_memory(monkeypatch):
    layer_costs, limits = llama_8b_32()
    ours = generate("roundrobin", num_ranks=8, num_microbatches=32, layer_costs=layer_costs, **limits)
    validate(ours)
    assert held_weights(ours)[0] <= 2 and held_weights(ours)[1] <= limits["weight_limit"]
    monkeypatch.setattr(roundrobin_search, "grown_sources", lambda best, unsplit: [unsplit])
    without = generate("roundrobin", num_ranks=8, num_microbatches=32, layer_costs=layer_costs, **limits)
    assert makespan(ours, layer_costs) < makespan(without, layer_costs) - 1.0  # 609.0 against 612.4
    assert pool_groups(ours).last == pool_groups(without).last + 1
