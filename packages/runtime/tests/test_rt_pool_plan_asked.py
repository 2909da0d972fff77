"""The automatic pool plan asks each generator question once per build, and a measured profile passed back
plans on the figures it was measured with (the copy bandwidth included)."""

from __future__ import annotations

from collections import Counter

import pytest

from bubbleless_partition import LayerCost, Profile
from bubbleless_runtime import pool_plan, pool_plan_cap
from bubbleless_runtime.pool_plan_cap import AskedOnce


def test_rt_pool_plan_asked_once_gives_the_same_answer_or_error_again_without_asking():
    asked = []

    def ask(**options):
        asked.append(options)
        if options.get("weight_limit", 9) < 2:
            raise ValueError(f"no cut within {options['weight_limit']}")
        return ("plan", tuple(sorted(options.items())))

    once = AskedOnce(ask)
    assert once(weight_limit=3, split_backward=False) == once(split_backward=False, weight_limit=3)
    for _ in range(2):
        with pytest.raises(ValueError, match="no cut within 1"):
            once(weight_limit=1)
    assert once(stages=[1, 2]) == ("plan", (("stages", [1, 2]),))  # an unhashable value is a key too
    assert asked == [{"weight_limit": 3, "split_backward": False}, {"weight_limit": 1}, {"stages": [1, 2]}]


def _tiny_profile(width: int = 64) -> Profile:
    from bubbleless_runtime._testing import tiny_model

    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in tiny_model(8, width=width)]
    return Profile(layers=tuple(
        LayerCost(name=f"l{i}", forward=1.0 if i < 7 else 3.0, input_grad=1.3, weight_grad=1.3, param_bytes=size,
                  activation_bytes_per_token=4 * width * 2, output_bytes_per_token=4 * width)
        for i, size in enumerate(sizes)), tokens_per_microbatch=width)


@pytest.mark.parametrize("options", [{}, {"split_backward": True}])
def test_rt_pool_plan_refusal_asks_no_generator_question_twice(monkeypatch, options):
    """A refusal searches again under larger budgets and lists the leanest plans: before, the same generator
    searches were asked again (24 of 51 on this profile and budget, options {}); now each once, and the
    refusal is the same (test_rt_pool_plan_cap checks its figures)."""
    asked = Counter()
    real = pool_plan_cap.generate

    def counted(name, **kwargs):
        asked[repr(sorted((k, v) for k, v in kwargs.items() if k not in ("layer_costs", "costs")))] += 1
        return real(name, **kwargs)

    monkeypatch.setattr(pool_plan_cap, "generate", counted)
    monkeypatch.setattr(pool_plan, "generate", counted)
    profile = _tiny_profile()
    with pytest.raises(ValueError, match="no round-robin plan of the 8 layers over 2 devices fits memory_budget="):
        pool_plan.auto_groups(profile, memory_cap=profile.layer_memory(profile.num_layers - 1) / 2, num_devices=2,
                              num_microbatches=4, name="roundrobin", options=options, bandwidth=None)
    assert asked and max(asked.values()) == 1, [k for k, n in asked.items() if n > 1]


def test_rt_pool_plan_a_measured_profile_passed_back_plans_on_its_own_copy_bandwidth(monkeypatch):
    """``partition="auto"`` records the copy bandwidth with the timings (``COPY_BANDWIDTH``); the profile passed
    back as ``partition=`` prices LOAD/STORE with it instead of measuring again, so it gets the same plan and
    costs (``pool_plan_refusal.SAME_TIMINGS`` promises this). A profile without the figure is measured for."""
    from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
    from bubbleless_runtime.pool import RoundRobinPipeline

    inputs, _ = tiny_batch(8, width=64)
    first = RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                               partition="auto", sample_input=inputs[:2], timeout=60)
    recorded = first.profile.extra[pool_plan.COPY_BANDWIDTH]
    assert recorded > 0

    def refused(device, nbytes=1 << 24):
        raise AssertionError("the bandwidth was measured again")

    monkeypatch.setattr(pool_plan, "copy_bandwidth", refused)
    again = RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                               partition=first.profile, timeout=60)
    assert again.schedule.to_text() == first.schedule.to_text() and again.stage_costs == first.stage_costs
    from bubbleless_runtime.report import pool_partition_effect

    assert "auto cut" in pool_partition_effect(again)  # the report prices the plan's LOAD/STORE the same way
    bare = first.profile.with_(extra={k: v for k, v in first.profile.extra.items() if k != pool_plan.COPY_BANDWIDTH})
    with pytest.raises(AssertionError, match="measured again"):
        RoundRobinPipeline(tiny_model(8, width=64), devices=["cpu"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                           partition=bare, timeout=60)
