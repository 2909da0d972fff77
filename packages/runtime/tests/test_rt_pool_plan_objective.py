"""The pool's automatic plan for the steps it will run: with the asynchronous optimizer the Trainer overlaps
consecutive steps (``RoundRobinPipeline.steps``), so the candidates are ranked by their steady-state period
(``objective="period"``), not one step's makespan; ``schedule_options={"objective": ...}`` chooses either.
The plan chosen for the period runs overlapped with exactly the arithmetic of single steps."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from bubbleless_runtime import pool_plan
from bubbleless_runtime._testing import relative_error, tiny_batch, tiny_model
from bubbleless_runtime._testing import tiny_loss as tiny_loss_fn
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import simulate
from bubbleless_schedules.simulate_steady import pool_steady_state

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool_async import SETTINGS, _assert_weights  # noqa: E402
from test_rt_pool_plan_unbudgeted import PLAN, TINY_BENCH  # noqa: E402


def _plan(objective: str | None):
    options = {} if objective is None else {"objective": objective}
    return pool_plan.auto_groups(TINY_BENCH, memory_cap=None, **{**PLAN, "options": options})


def _steady(schedule, costs, load_stream=False):
    return pool_steady_state(schedule, costs, iterations=pool_plan.JUDGED_ITERATIONS, load_stream=load_stream)


def test_rt_pool_plan_period_objective_ranks_by_the_steady_period_and_makespan_by_one_step():
    default, by_makespan, by_period = _plan(None), _plan("makespan"), _plan("period")
    assert default[1].to_text() == by_makespan[1].to_text()
    steady = {name: _steady(plan[1], plan[2]) for name, plan in (("makespan", by_makespan), ("period", by_period))}
    # 2 devices, 8 micro-batches: the makespan plan (1,) / 7 / (1,) steps in 360.9 with period 360.9; the whole
    # model as one job on one device steps in 705.2, but the two devices then run every other step whole
    assert by_period[0] != by_makespan[0]
    assert steady["period"].period < steady["makespan"].period - 1e-6  # 352.6 against 360.9
    assert steady["period"].period >= steady["period"].work / 2 - 1e-9  # no faster than the devices can
    assert simulate(by_makespan[1], by_makespan[2]).makespan < simulate(by_period[1], by_period[2]).makespan


def test_rt_pool_plan_unknown_objective_names_the_choices():
    with pytest.raises(ValueError, match="objective='throughput': choose one of makespan, period"):
        _plan("throughput")


@pytest.mark.parametrize("partition", ["even", pool_plan.PoolGroups((1,), 7, (1,))])
def test_rt_pool_objective_with_a_fixed_cut_says_it_ranks_only_searched_plans(partition):
    with pytest.raises(ValueError, match="fixed cut with one dispatch, so there is nothing to rank: drop the "
                                         "objective or pass partition='auto'"):
        RoundRobinPipeline(tiny_model(8), devices=["cpu"] * 2, num_microbatches=8, loss_fn=tiny_loss_fn,
                           partition=partition, schedule_options={"objective": "makespan"}, timeout=60)


def _pool(model, schedule_options=None, asynchronous=True):
    return RoundRobinPipeline(model, devices=["cpu"] * 2, num_microbatches=8, loss_fn=tiny_loss_fn,
                              partition=TINY_BENCH, optimizer={**SETTINGS, "asynchronous": asynchronous},
                              schedule_options=schedule_options, timeout=60)


def test_rt_pool_asynchronous_optimizer_plans_for_overlapped_steps_unless_told_otherwise():
    by_period, by_makespan = _plan("period")[1].to_text(), _plan("makespan")[1].to_text()
    assert _pool(tiny_model(8)).schedule.to_text() == by_period
    assert _pool(tiny_model(8), asynchronous=False).schedule.to_text() == by_makespan
    assert _pool(tiny_model(8), {"objective": "makespan"}).schedule.to_text() == by_makespan


def test_rt_pool_period_plan_runs_overlapped_steps_as_single_steps_of_the_makespan_plan():
    """The period plan here runs the whole model as one job on one device (the other device's row empty):
    overlapped, each device takes every other step. Its weights after four steps equal those of the makespan
    plan's steps one at a time (the same one-step-stale arithmetic, another cut)."""
    batches = [tiny_batch(8, seed=s) for s in (1, 2, 3, 4)]
    overlapped, single = tiny_model(8), tiny_model(8)
    pipe, loop = _pool(overlapped), _pool(single, {"objective": "makespan"})
    assert any(not row for row in pipe.schedule.actions)
    losses = list(pipe.steps(batches))
    want = [loop.step(*batch) for batch in batches]
    assert max(relative_error(a, b) for a, b in zip(losses, want, strict=True)) <= 1e-5
    pipe.synchronize()
    loop.synchronize()
    _assert_weights(overlapped, single, tolerance=1e-5)


def test_rt_pool_plan_period_on_a_gpu_pool_is_judged_with_uploads_on_the_copy_stream():
    _, schedule, costs = _plan("makespan")
    in_order = pool_plan.plan_judge("period")(schedule, costs)
    streamed = pool_plan.plan_judge("period", load_stream=True)(schedule, costs)
    assert in_order == pytest.approx(_steady(schedule, costs).period)
    assert streamed == pytest.approx(_steady(schedule, costs, load_stream=True).period)
    assert streamed < in_order - 1e-6  # the uploads overlap the compute there
    assert pool_plan.plan_judge("makespan", load_stream=True)(schedule, costs) == pytest.approx(
        simulate(schedule, costs).makespan)


def test_rt_pool_report_says_what_the_plans_were_ranked_by():
    from bubbleless_runtime.report import pool_partition_effect

    overlapped, single = _pool(tiny_model(8)), _pool(tiny_model(8), asynchronous=False)
    assert (overlapped.plan_objective, single.plan_objective) == ("period", "makespan")
    text = pool_partition_effect(overlapped)
    assert "steady period of overlapped steps kept: objective period" in text
    assert "steady period of overlapped steps 352.578 ms" in text and "(one step alone, uploads in the compute order)" in text
    assert "the fastest simulated kept" in pool_partition_effect(single)
    assert "steady period" not in pool_partition_effect(single)


def _quietly(call, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return call(*args)


def test_rt_pool_first_single_step_of_a_plan_made_for_overlapped_steps_warns_once():
    batch = tiny_batch(8, seed=1)
    pipe = _pool(tiny_model(8))  # asynchronous, no objective asked: planned by the period
    with pytest.warns(UserWarning, match=r"step\(\) runs one step at a time.*pipe.steps\(batches\).*"
                                         r"schedule_options=\{'objective': 'makespan'\}"):
        pipe.step(*batch)
    _quietly(pipe.step, *batch)  # once per pipeline
    for options, asynchronous in (({"objective": "period"}, True), ({"objective": "makespan"}, True), (None, False)):
        _quietly(_pool(tiny_model(8), options, asynchronous).step, *batch)  # asked, or single steps anyway
    overlapping = _pool(tiny_model(8))
    _quietly(lambda: list(overlapping.steps([batch, batch])))
    _quietly(overlapping.step, *batch)  # a step() between overlapped runs is no mistake


@pytest.mark.parametrize("load_stream", [False, True])
def test_rt_pool_auto_groups_judges_with_the_copy_stream_it_is_given(monkeypatch, load_stream):
    asked = []
    real = pool_plan.plan_judge

    def recording(objective, *, load_stream=False):
        asked.append((objective, load_stream))
        return real(objective, load_stream=load_stream)

    monkeypatch.setattr(pool_plan, "plan_judge", recording)
    pool_plan.auto_groups(TINY_BENCH, memory_cap=None, load_stream=load_stream,
                          **{**PLAN, "options": {"objective": "period"}})
    assert asked and set(asked) == {("period", load_stream)}  # a GPU pool's uploads on the copy stream
