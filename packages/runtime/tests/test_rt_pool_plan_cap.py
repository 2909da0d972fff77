"""The pool's automatic plan under a memory cap: the layer-cost generator is a candidate too, and no
returned plan holds more than the cap allows (two groups' worth per device)."""

from __future__ import annotations

import re

import pytest

from bubbleless_partition import LayerCost, Profile, cut
from bubbleless_runtime import pool_plan
from bubbleless_runtime.pool_plan_cap import largest_fitting, most_layers_within, plan_peak_bytes
from bubbleless_schedules import Schedule, generate, simulate
from bubbleless_schedules.roundrobin_layout import pool_groups

HEADER = ("# bubbleless-schedule name=roundrobin stages=5 microbatches=2 layout=roundrobin "
          "meta.forward_layers=2,1 meta.last_layers=1 meta.backward_layers=1,2\n")
"""Jobs: 0 = F layers 0-1, 1 = F layer 2, 2 = the fused layer 3, 3 = R/B layers 1-2, 4 = R/B layer 0."""
SMALL = Profile(layers=tuple(
    LayerCost(name=f"l{i}", forward=1.0, input_grad=1.0, weight_grad=1.0, param_bytes=w, activation_bytes_per_token=a)
    for i, (w, a) in enumerate([(1, 10), (2, 20), (4, 40), (8, 80)])))
"""Job weights 3, 4, 8, 6, 1 bytes; a micro-batch of job 2 keeps 80, of job 3 60, of job 4 10 (one token)."""


def _schedule(*rows: str) -> Schedule:
    return Schedule.from_text(HEADER + "\n".join(rows) + "\n")


@pytest.mark.parametrize(("rows", "peaks"), [
    # one micro-batch held at a time: device 0's job 2 with job 4 prefetched (8 + 1 + 80), device 1's job 3 (6 + 60)
    (("0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3B0 3R1 3B1"), (89, 66)),
    # recomputing two micro-batches ahead holds both
    (("0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3R1 3B0 3B1"), (89, 6 + 120)),
    # the fused job split over both devices: its weights on each (device 1: 8 + 6 + 80)
    (("0F0 0F1 2F0 2B0 4R0 4B0 4R1 4B1", "1F0 1F1 2F1 2B1 3R0 3B0 3R1 3B1"), (89, 94)),
    # B split into I and W, both W deferred: the activations stay until W (I frees nothing)
    (("0F0 0F1 2F0 2I0 2F1 2I1 2W0 2W1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3B0 3R1 3B1"), (9 + 160, 66)),
    # with LOAD/STORE: the same
    (("0LOAD 0F0 0F1 2LOAD 2F0 2B0 2F1 2B1 2STORE 4LOAD 4R0 4B0 4R1 4B1 4STORE",
      "1LOAD 1F0 1F1 3LOAD 3R0 3B0 3R1 3B1 3STORE"), (89, 66)),
])
def test_rt_pool_plan_peak_bytes_counts_weights_of_two_jobs_and_held_activations(rows, peaks):
    assert plan_peak_bytes(_schedule(*rows), SMALL) == peaks


def test_rt_pool_plan_peak_bytes_scales_weights_by_the_state_per_param_byte():
    rows = ("0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3B0 3R1 3B1")
    assert plan_peak_bytes(_schedule(*rows), SMALL.with_(state_bytes_per_param_byte=2.0)) == (98, 72)
    with pytest.raises(ValueError, match="profile has 3"):
        plan_peak_bytes(_schedule(*rows), SMALL.with_(layers=SMALL.layers[:3]))


# A heavy fused head (the LM head): the generator splits it over devices, which the DP cuts cannot.
HEAD = LayerCost(name="head", forward=3.0, input_grad=3.0, weight_grad=3.0, param_bytes=60.0,
                 activation_bytes_per_token=6.0)
BODY = tuple(LayerCost(name=f"layer{i}", forward=1.0, input_grad=1.3, weight_grad=1.3, param_bytes=10.0,
                       activation_bytes_per_token=2.0) for i in range(7))
PROFILE = Profile(layers=BODY + (HEAD,), tokens_per_microbatch=4)
PLAN = {"num_devices": 2, "num_microbatches": 4, "name": "roundrobin", "options": {}, "bandwidth": None}


def _makespan(schedule: Schedule, profile: Profile = PROFILE) -> float:
    return simulate(schedule, pool_plan.job_costs(profile, pool_groups(schedule), bandwidth=None)).makespan


def _best_cut_makespan(memory_cap: float | None, profile: Profile = PROFILE) -> float:
    """The fastest DP cut over every count of backward groups, on 2 devices at 4 micro-batches (what
    auto_groups tried alone under a cap before)."""
    spans = []
    for count in range(1, profile.num_layers + 1):
        try:
            part = cut(profile, num_stages=count, method="roundrobin", num_microbatches=4, memory_cap=memory_cap)
        except ValueError:
            continue
        groups = pool_plan.groups_from_partition(part)
        spans.append(_makespan(pool_plan.generate_pool(
            "roundrobin", groups, num_layers=profile.num_layers, num_devices=2, num_microbatches=4,
            costs=pool_plan.job_costs(profile, groups, bandwidth=None), options={}), profile))
    return min(spans)


def _device_bytes(schedule: Schedule, profile: Profile) -> list[float]:
    """Per device, its peak summed afresh: at each action, the weights of every job whose span on the device
    covers it plus, while fewer than two do, the next job to start, and the activations of every micro-batch
    opened (R, or the fused group's F) and not yet closed (B or W) there."""
    groups = pool_groups(schedule)
    out = []
    for row in schedule.actions:
        spans = {}
        for position, action in enumerate(row):
            first, _ = spans.get(action.stage, (position, position))
            spans[action.stage] = (first, position)
        worst = 0.0
        for position in range(len(row)):
            live = [j for j, (a, b) in spans.items() if a <= position <= b]
            later = sorted((a, j) for j, (a, _) in spans.items() if a > position)
            jobs = set(live) | ({later[0][1]} if later and len(live) < 2 else set())
            weights = sum(profile.layers[i].param_bytes for j in jobs for i in groups.layers(j))
            kept = 0.0
            for opened, action in enumerate(row[:position + 1]):
                holds = action.kind.value == "R" or action.kind.value == "F" and groups.role(action.stage) == "last"
                closed = any(b.stage == action.stage and b.microbatch == action.microbatch and b.kind.value in "BW"
                             for b in row[opened + 1:position + 1])
                if holds and not closed:
                    kept += sum(profile.layers[i].activation_bytes_per_token for i in groups.layers(action.stage))
            worst = max(worst, weights + kept * profile.tokens_per_microbatch)
        out.append(worst)
    return out


def test_rt_pool_auto_plan_under_a_generous_cap_keeps_the_generators_faster_plan():
    cap = 1e9
    _, schedule, costs = pool_plan.auto_groups(PROFILE, memory_cap=cap, **PLAN)
    generated = generate("roundrobin", num_ranks=2, num_microbatches=4, weight_limit=PROFILE.num_layers,
                         layer_costs=pool_plan.layer_costs_of(PROFILE, bandwidth=None))
    assert _makespan(generated) < _best_cut_makespan(cap) - 1e-9  # the generator's plan is the faster here
    assert schedule.actions == generated.actions
    assert simulate(schedule, costs).makespan == pytest.approx(_makespan(generated))


def test_rt_pool_auto_plan_under_tight_caps_never_returns_a_plan_over_the_cap():
    free = generate("roundrobin", num_ranks=2, num_microbatches=4, weight_limit=PROFILE.num_layers,
                    layer_costs=pool_plan.layer_costs_of(PROFILE, bandwidth=None))
    free_peak = max(_device_bytes(free, PROFILE))
    smallest = max(PROFILE.layer_memory(i) for i in range(PROFILE.num_layers))  # one layer per group
    binding = 0
    for step in range(13):
        cap = smallest + (free_peak / 2 - smallest) * step / 12
        _, schedule, _ = pool_plan.auto_groups(PROFILE, memory_cap=cap, **PLAN)
        assert max(_device_bytes(schedule, PROFILE)) <= 2 * cap + 1e-9, (cap, schedule.to_text())
        binding += free_peak > 2 * cap
    assert binding >= 10  # the generator's unconstrained plan is over most of these caps


SPLIT_FUSED = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=5 microbatches=4 layout=roundrobin meta.forward_layers=1,1 "
    "meta.last_layers=6 meta.backward_layers=1,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2I0 2F2 2I2 2W0 2W2 2STORE 3LOAD 3R0 3I0 3R1 3I1 3W0 3R2 3I2 3W1 3R3 3I3 3W2 "
    "3W3 3STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F1 2I1 2F3 2I3 2W1 2W3 2STORE 4LOAD 4R0 4R1 4I0 4W0 4I1 4R2 4W1 4I2 4R3 4W2 4I3 "
    "4W3 4STORE\n")
"""The plan the layer-cost generator gave ``PROFILE`` under a 1e9 budget at f06d1d3: the fused group over both
devices, which no DP cut does."""


def test_rt_pool_with_a_memory_budget_runs_the_generators_split_plan_with_the_unpipelined_gradients(monkeypatch):
    """``RoundRobinPipeline(memory_budget=...)`` plans with a cap; the generator's plan (here pinned to
    ``SPLIT_FUSED``, so the test does not follow the generator's later choices) wins over the DP cuts, runs
    and gives the unpipelined model's gradients."""
    from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
    from bubbleless_runtime.pool import RoundRobinPipeline

    monkeypatch.setattr(pool_plan, "generated_within", lambda *_, **__: [SPLIT_FUSED])
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              partition=PROFILE, memory_budget=1e9, timeout=60)
    assert pipe.schedule.actions == SPLIT_FUSED.actions, pipe.schedule.to_text()
    loss = pipe.step(inputs, targets)
    want_loss, want = reference_grads(ref, inputs, targets, 4)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


def test_rt_pool_auto_plan_with_a_cap_nothing_fits_says_what_to_change():
    head = PROFILE.layer_memory(PROFILE.num_layers - 1)  # the head's weights and one micro-batch of it
    with pytest.raises(ValueError, match="smallest cap that fits"):  # cut()'s rule (a group within the cap)
        cut(PROFILE, num_stages=PROFILE.num_layers, method="roundrobin", num_microbatches=4, memory_cap=head * 0.9)
    _, schedule, _ = pool_plan.auto_groups(PROFILE, memory_cap=head * 0.9, **PLAN)  # but a device holds two
    assert max(_device_bytes(schedule, PROFILE)) <= 2 * head * 0.9 + 1e-9
    with pytest.raises(ValueError, match="fits memory_budget=.* per device.*Raise memory_budget"):
        pool_plan.auto_groups(PROFILE, memory_cap=head / 2 * 0.95, **PLAN)


def test_rt_pool_auto_plan_keeps_a_given_weight_limit_and_refuses_its_plan_over_the_cap():
    options = {"weight_limit": PROFILE.num_layers}
    generated = generate("roundrobin", num_ranks=2, num_microbatches=4, layer_costs=pool_plan.layer_costs_of(
        PROFILE, bandwidth=None), **options)
    peak = max(_device_bytes(generated, PROFILE))
    _, schedule, _ = pool_plan.auto_groups(PROFILE, memory_cap=peak / 2, **{**PLAN, "options": options})
    assert schedule.actions == generated.actions
    _, schedule, _ = pool_plan.auto_groups(PROFILE, memory_cap=peak / 2 - 1, **{**PLAN, "options": options})
    assert max(_device_bytes(schedule, PROFILE)) <= peak - 2


@pytest.mark.parametrize(("high", "no_cut_below", "fits_up_to", "found"), [
    (20, 3, 9, 9),      # down 20, 19, 17, 13, 5 (fits): then the largest between 6 and 12
    (20, 3, 20, 20),    # the first try fits
    (20, 11, 14, 14),   # 13 fits on the way down
    (20, 12, 11, None),  # no cut within 12 or less, and over the budget above it
    (20, 6, 8, 8),      # 5 finds no cut: the largest between 6 and 12
    (0, 1, 5, None),
])
def test_rt_pool_plan_largest_fitting_weight_limit(high, no_cut_below, fits_up_to, found):
    tried = []

    def plan_at(limit):
        tried.append(limit)
        return None if limit < no_cut_below else limit

    assert largest_fitting(plan_at, lambda plan: plan <= fits_up_to, high) == found
    assert len(tried) <= 8 and all(1 <= limit <= max(high, 1) for limit in tried)


def test_rt_pool_plan_most_layers_whose_weights_alone_fit():
    assert most_layers_within(SMALL, 7) == 3           # 1 + 2 + 4
    assert most_layers_within(SMALL, 0.5) == 0
    assert most_layers_within(SMALL.with_(state_bytes_per_param_byte=2.0), 7) == 2


def _tiny_profile(width: int = 64) -> Profile:
    """A profile consistent with ``tiny_model(8, width)``: its layers' parameter bytes, a heavier head."""
    from bubbleless_runtime._testing import tiny_model

    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in tiny_model(8, width=width)]
    return Profile(layers=tuple(
        LayerCost(name=f"l{i}", forward=1.0 if i < 7 else 3.0, input_grad=1.3, weight_grad=1.3, param_bytes=size,
                  activation_bytes_per_token=4 * width * 2, output_bytes_per_token=4 * width)
        for i, size in enumerate(sizes)), tokens_per_microbatch=width)


@pytest.mark.parametrize("budget", [104000, 160000, 224000, 232000, 240000, 320000, 328000, 392000])
def test_rt_pool_plan_cap_a_plan_auto_groups_returns_passes_the_pools_fit_check_and_runs(budget):
    """The plan's peak (``plan_peak_bytes``) and the pool's fit check (``check_fits``) are one walk: the
    uploaded input and the gradient handed down of every micro-batch held count in both, so a budget the
    automatic plan is held to never refuses that plan (224000 and 232000 did: 216832 planned, 233216 checked).
    104000 is about the leanest budget a plan fits since a held micro-batch's upload counts in full."""
    import torch

    from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
    from bubbleless_runtime.pool import RoundRobinPipeline
    from bubbleless_runtime.pool_memory import device_peaks

    profile = _tiny_profile()
    _, planned, _ = pool_plan.auto_groups(profile, memory_cap=budget / 2, **PLAN)
    assert max(plan_peak_bytes(planned, profile)) <= budget
    pipe = RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                              partition=profile, memory_budget=budget, timeout=60)
    assert [peak for peak, _ in device_peaks(pipe.schedule, pipe.store, profile)] == \
        list(plan_peak_bytes(pipe.schedule, profile))
    inputs, targets = tiny_batch(8, width=64)
    assert torch.isfinite(pipe.step(inputs, targets))


def test_rt_pool_plan_cap_no_plan_names_the_smallest_peak_and_its_group_count():
    """Every cut within cut()'s per-group rule but over the device budget once the inputs and gradients
    held count: the error gives the leanest peak seen, the cut that had it, and the budget to raise to."""
    wide = Profile(layers=tuple(LayerCost(name=f"l{i}", forward=1.0, input_grad=1.0, weight_grad=1.0, param_bytes=10.0,
                                          activation_bytes_per_token=1.0, output_bytes_per_token=20.0)
                                for i in range(6)))
    with pytest.raises(ValueError, match=r"fits memory_budget=55 bytes per device .*the leanest plan it finds, "
                                         r"the cut into 6 backward groups, holds 61 bytes .*accepts "
                                         r"memory_budget=61 on this profile's timings. .*partition=.*Raise memory_budget to at least that"):
        pool_plan.auto_groups(wide, memory_cap=27.5, **PLAN)
    pool_plan.auto_groups(wide, memory_cap=30.5, **PLAN)  # 61: two jobs' 20, a micro-batch's 1, its 20 in and 20 out


def test_rt_pool_plan_refusal_names_the_device_budget_the_search_accepts():
    """The refusal speaks of RoundRobinPipeline's knob (memory_budget, bytes a device), not cut()'s per-group
    memory_cap, and the budget it names is one the same search accepts; cut()'s "smallest cap that fits" was
    neither (asked 2 x 56,896 per group on this profile where a plan fits at less)."""
    profile = _tiny_profile()
    head = profile.layer_memory(profile.num_layers - 1)
    with pytest.raises(ValueError, match="memory_budget=") as caught:
        pool_plan.auto_groups(profile, memory_cap=head / 2, **PLAN)
    text = str(caught.value)
    assert "memory_cap" not in text and "per group" not in text, text
    named = float(re.search(r"accepts memory_budget=(\d+)", text).group(1))
    _, schedule, _ = pool_plan.auto_groups(profile, memory_cap=named / 2, **PLAN)
    assert max(plan_peak_bytes(schedule, profile)) <= named
    with pytest.raises(ValueError, match="no round-robin plan"):  # the leanest any candidate reached
        pool_plan.auto_groups(profile, memory_cap=(named - 1) / 2, **PLAN)


def test_rt_pool_plan_refusal_says_its_budget_holds_for_the_timings_and_how_to_keep_them():
    """Each build with partition='auto' measures the timings again and the plan follows them (3 of 30 builds
    with jittered timings refused the budget named for the unjittered profile): the message says the figure
    is for this profile's timings and names what keeps them, a Profile passed as partition= (pipe.profile,
    the attribute a pool keeps its measured profile in)."""
    from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
    from bubbleless_runtime.pool import RoundRobinPipeline
    from bubbleless_runtime.pool_plan_refusal import SAME_TIMINGS

    profile = _tiny_profile()
    with pytest.raises(ValueError) as caught:
        pool_plan.auto_groups(profile, memory_cap=profile.layer_memory(profile.num_layers - 1) / 2, **PLAN)
    assert "on this profile's timings. " + SAME_TIMINGS in str(caught.value)
    assert "pipe.profile" in SAME_TIMINGS and "pool_plan.profile_layers(layers, sample_input, device)" in SAME_TIMINGS
    inputs, _ = tiny_batch(8, width=64)
    measured = RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                                  partition="auto", sample_input=inputs[:2], timeout=60).profile
    assert isinstance(measured, Profile) and measured.num_layers == 8
    again = RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                               partition=measured, timeout=60)
    assert again.profile is measured


def test_rt_pool_plan_refusal_asks_the_generator_a_bounded_number_of_times(monkeypatch):
    """The refusal's leanest generator plans cost a few searches a dispatch, not one for every weight limit of
    every dispatch (128 on this 32-layer profile over 4 devices, 140 s where planning took 1.4-2.5 s): the
    smallest limit the generator plans at (doubling, then bisection) and the limits above it while the peak
    does not rise. The candidates still hold the leanest plan of all limits (weight_limit=2, 2,140,000)."""
    from bubbleless_runtime import pool_plan_cap

    layers = 32
    deep = Profile(layers=tuple(
        LayerCost(name=f"l{i}", forward=1.0 if i < layers - 1 else 4.0, input_grad=1.1, weight_grad=1.1,
                  param_bytes=1e6, activation_bytes_per_token=100.0, output_bytes_per_token=20.0)
        for i in range(layers)), tokens_per_microbatch=1000)
    asked = []
    real = pool_plan_cap.generate

    def counted(*args, **kwargs):
        asked.append(kwargs.get("weight_limit"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pool_plan_cap, "generate", counted)
    candidates = pool_plan_cap.leanest_generated(deep, layer_costs=pool_plan.layer_costs_of(deep, bandwidth=None),
                                                 num_devices=4, num_microbatches=16, options={})
    assert len(asked) <= 1 + 4 * (2 * 5 + pool_plan_cap.FALLING_STEPS), asked
    assert len(asked) <= 16, asked  # measured: 13 (own, and limits 1, 2, 3 for each of four dispatches)
    assert min(peak for peak, _ in candidates) == 2_140_000



def test_rt_pool_plan_cap_candidates_are_the_generators_own_plan_and_each_dispatchs_largest_fitting(monkeypatch):
    """The generator is a heuristic, monotone neither in ``weight_limit`` nor in the dispatch, so every
    plan that fits goes to the simulator: its own plan (no ``weight_limit``), each dispatch's plan at the
    most layers that could fit, and for a dispatch over the budget there, its plan at the largest smaller
    limit that fits. Before, a leaner dispatch that fit at the most layers ended the search, and the
    generator's own limit was never asked for. A stand-in generator gives known plans (``_schedule``'s)."""
    from bubbleless_runtime import pool_plan_cap

    one_ahead = _schedule("0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3B0 3R1 3B1")  # (89, 66)
    with_transfers = _schedule("0LOAD 0F0 0F1 2LOAD 2F0 2B0 2F1 2B1 2STORE 4LOAD 4R0 4B0 4R1 4B1 4STORE",
                               "1LOAD 1F0 1F1 3LOAD 3R0 3B0 3R1 3B1 3STORE")  # (89, 66)
    fused_split = _schedule("0F0 0F1 2F0 2B0 4R0 4B0 4R1 4B1", "1F0 1F1 2F1 2B1 3R0 3B0 3R1 3B1")  # (89, 94)
    two_ahead = _schedule("0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3R1 3B0 3B1")  # (89, 126)
    deferred = _schedule("0F0 0F1 2F0 2I0 2F1 2I1 2W0 2W1 4R0 4B0 4R1 4B1", "1F0 1F1 3R0 3B0 3R1 3B1")  # (169, 66)
    asked = []

    def generate(name, *, weight_limit=None, recompute_ahead=None, split_backward=None, **_):
        asked.append((weight_limit, recompute_ahead, split_backward))
        if weight_limit is None:
            return fused_split
        if recompute_ahead is None and split_backward is None:  # the generator's own dispatch
            return deferred if weight_limit == 4 else with_transfers
        return one_ahead if split_backward is False else two_ahead

    monkeypatch.setattr(pool_plan_cap, "generate", generate)
    found = pool_plan_cap.generated_within(SMALL, 100, layer_costs=None, num_devices=2, num_microbatches=2, options={})
    assert [s.to_text() for s in found] == [s.to_text() for s in (fused_split, one_ahead, with_transfers)], asked
    assert (4, None, None) in asked and (2, None, None) in asked  # the own dispatch, over at 4 layers, fits at 2
