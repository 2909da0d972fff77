"""RoundRobinPipeline running split-backward schedules (I, then W deferred into waits): the unpipelined
model's loss and gradients (plain blocks, a fused group split over devices, a device ending a later-started
job first, a tiny HF model with LoRA),
bad orders refused before running, and what a deferred W keeps counted until it runs and then freed."""

import os
import sys

import pytest
import torch

from bubbleless_runtime import pool_split, pool_worker
from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import Action, Kind, Schedule
from bubbleless_schedules.roundrobin_layout import pool_groups

CPU2 = ["cpu", "cpu"]
M = 4
HEADER = "# bubbleless-schedule name=roundrobin microbatches=4 layout=roundrobin "
SCHEDULES = {
    # what ``roundrobin`` emitted at f06d1d3 (layer costs [1.0] x 7 + [3.0], I = W = 1.2, split_backward=True), written
    # out so each test keeps the order it needs whatever the generator picks later:
    # on the cut forward [3, 3], last 2, backward [1, 1, 2, 2]: every W deferred past the next micro-batch's I
    "pinned": HEADER + "stages=7 meta.forward_layers=3,3 meta.last_layers=2 meta.backward_layers=1,1,2,2\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2I0 2F1 2I1 2W0 2W1 2STORE 3LOAD 3R0 3I0 3R1 3I1 3W0 3R2 3I2 3W1 3R3 3I3 3W2 "
    "3W3 3STORE 5LOAD 5R0 5I0 5R1 5I1 5W0 5R2 5I2 5W1 5R3 5I3 5W2 5W3 5STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F2 2I2 2F3 2I3 2W2 2W3 2STORE 4LOAD 4R0 4I0 4R1 4I1 4W0 4R2 4I2 4W1 4R3 4I3 4W2 "
    "4W3 4STORE 6LOAD 6R0 6I0 6R1 6I1 6W0 6R2 6I2 6W1 6R3 6I3 6W2 6W3 6STORE\n",
    # on its own cut: one forward group, the fused group's W all after its last I
    "chosen": HEADER + "stages=6 meta.forward_layers=6 meta.last_layers=2 meta.backward_layers=1,2,2,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2R0 2I0 2W0 2R1 2I1 2W1 2R2 2I2 2W2 2R3 2I3 2W3 2STORE 3LOAD 3R0 3I0 3W0 3R1 3I1 3W1 "
    "3R2 3I2 3W2 3R3 3I3 3W3 3STORE 5LOAD 5R0 5I0 5W0 5R1 5I1 5W1 5R2 5I2 5W2 5R3 5I3 5W3 5STORE\n"
    "1LOAD 1F0 1I0 1F1 1I1 1F2 1I2 1F3 1I3 1W0 1W1 1W2 1W3 1STORE 4LOAD 4R0 4I0 4W0 4R1 4I1 4W1 4R2 4I2 4W2 4R3 4I3 "
    "4W3 4STORE\n",
    # the fused group split over both devices, micro-batches interleaved (the search's ``split_job``)
    "fused-over-two": HEADER + "stages=7 meta.forward_layers=3,3 meta.last_layers=2 meta.backward_layers=1,1,2,2\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2I0 2F2 2I2 2W0 2W2 2STORE 3LOAD 3R0 3I0 3W0 3R1 3I1 3W1 3R2 3I2 3W2 3R3 3I3 3W3 "
    "3STORE 5LOAD 5R0 5I0 5W0 5R1 5I1 5W1 5R2 5I2 5W2 5R3 5I3 5W3 5STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F1 2I1 2F3 2I3 2W1 2W3 2STORE 4LOAD 4R0 4I0 4W0 4R1 4I1 4W1 4R2 4I2 4W2 4R3 4I3 4W3 "
    "4STORE 6LOAD 6R0 6I0 6W0 6R1 6I1 6W1 6R2 6I2 6W2 6R3 6I3 6W3 6STORE\n",
    # 8 equal layers on 3 devices, without split_backward: devices 0 and 2 start a backward job, then run their
    # share of the fused job 5 from LOAD to STORE before ending it
    "later-started-ends-first": HEADER + "stages=12 meta.forward_layers=1,1,1,1,2 meta.last_layers=2 "
    "meta.backward_layers=1,1,1,1,1,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 3LOAD 3F0 3F1 3F2 3F3 8LOAD 8R0 8R1 5LOAD 5F1 5I1 5F3 5I3 5W1 5W3 5STORE 8I0 8W0 8I1 8W1 "
    "8R2 8I2 8W2 8R3 8I3 8W3 8STORE 11LOAD 11R0 11I0 11W0 11R1 11I1 11W1 11R2 11I2 11W2 11R3 11I3 11W3 11STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 4LOAD 4F0 4F1 4F2 4F3 6LOAD 6R0 6I0 6W0 6R1 6I1 6W1 6R2 6I2 6W2 6R3 6I3 6W3 6STORE 9LOAD "
    "9R0 9I0 9W0 9R1 9I1 9W1 9R2 9I2 9W2 9R3 9I3 9W3 9STORE\n"
    "2LOAD 2F0 2F1 2F2 2F3 7LOAD 7R0 5LOAD 5F0 5I0 5F2 5I2 5W0 5W2 5STORE 7I0 7W0 7R1 7I1 7W1 7R2 7I2 7W2 7R3 7I3 "
    "7W3 7STORE 10LOAD 10R0 10I0 10W0 10R1 10I1 10W1 10R2 10I2 10W2 10R3 10I3 10W3 10STORE\n",
    # B whole (no split_backward) on the pinned cut, one micro-batch recomputed at a time
    # a tiny Qwen3's 6 layers (costs [1.0] x 5 + [2.0]) on forward [2, 2], last 2, backward [1, 2, 1]
    "qwen3-lora": HEADER + "stages=6 meta.forward_layers=2,2 meta.last_layers=2 meta.backward_layers=1,2,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2I0 2F1 2I1 2W0 2W1 2STORE 3LOAD 3R0 3I0 3R1 3I1 3W0 3R2 3I2 3W1 3R3 3I3 3W2 "
    "3W3 3STORE 5LOAD 5R0 5I0 5R1 5I1 5W0 5R2 5I2 5W1 5R3 5W2 5I3 5W3 5STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F2 2I2 2F3 2I3 2W2 2W3 2STORE 4LOAD 4R0 4I0 4R1 4I1 4W0 4R2 4I2 4W1 4R3 4I3 4W2 "
    "4W3 4STORE\n",
    "whole": HEADER + "stages=7 meta.forward_layers=3,3 meta.last_layers=2 meta.backward_layers=1,1,2,2\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2STORE 4LOAD 4R0 4B0 4R1 4B1 4R2 4B2 4R3 4B3 4STORE "
    "6LOAD 6R0 6B0 6R1 6B1 6R2 6B2 6R3 6B3 6STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 3LOAD 3R0 3B0 3R1 3B1 3R2 3B2 3R3 3B3 3STORE 5LOAD 5R0 5B0 5R1 5B1 5R2 5B2 5R3 5B3 5STORE\n",
}


def _split_schedule(name="pinned"):
    schedule = Schedule.from_text(SCHEDULES[name])
    kinds = {a.kind for _, _, a in schedule.all_actions()}
    assert {Kind.I, Kind.W} <= kinds and Kind.B not in kinds, schedule.render()
    return schedule


def _pipe(model, schedule, **kwargs):
    return RoundRobinPipeline(model, devices=["cpu"] * schedule.num_workers, num_microbatches=M,
                              loss_fn=kwargs.pop("loss_fn", tiny_loss), schedule=schedule, timeout=60, **kwargs)


def _assert_unpipelined(model, ref, inputs, targets, loss, steps=1):
    want_loss, want = reference_grads(ref, inputs, targets, M)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    errors = {n: relative_error(got[n], steps * want[n]) for n in want}
    assert max(errors.values()) <= 1e-5, errors
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


@pytest.mark.parametrize("cut", ["pinned", "chosen"])
def test_rt_pool_split_backward_gradients_equal_unpipelined(cut):
    schedule = _split_schedule(cut)
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    pipe = _pipe(model, schedule)
    pipe.step(inputs, targets)
    loss = pipe.step(inputs, targets)  # .grad accumulates over steps, as two loss.backward() calls would
    _assert_unpipelined(model, ref, inputs, targets, loss, steps=2)
    assert {span.action.kind for span in pipe.last_timeline.spans} >= {Kind.I, Kind.W, Kind.STORE}


def test_rt_pool_split_backward_fused_group_over_two_devices():
    """The fused last group split over both devices, each running F, I and its deferred W for its
    micro-batches and storing its partial gradients after them."""
    schedule = _split_schedule("fused-over-two")
    last = pool_groups(schedule).last_stage
    assert all(any(a.stage == last and a.kind is Kind.W for a in row) for row in schedule.actions), schedule.render()
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    loss = _pipe(model, schedule).step(inputs, targets)
    _assert_unpipelined(model, ref, inputs, targets, loss)


def _ends_a_later_job_first(schedule) -> bool:
    for row in schedule.actions:
        first = {a.stage: p for p, a in reversed(list(enumerate(row)))}
        last = {a.stage: p for p, a in enumerate(row)}
        ends = [last[job] for job in sorted(first, key=first.__getitem__)]
        if any(a > b for a, b in zip(ends, ends[1:], strict=False)):
            return True
    return False


def test_rt_pool_split_backward_device_ending_a_later_started_job_first():
    """The generator's own plan (written out) where a device recomputes its next job early, then runs its part of the
    split fused group from start to STORE before that job ends: the pool prefetches within two jobs'
    weights (``pool_worker._prefetch``) and the gradients are the unpipelined model's."""
    schedule = _split_schedule("later-started-ends-first")
    assert _ends_a_later_job_first(schedule), schedule.render()
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    loss = _pipe(model, schedule).step(inputs, targets)
    _assert_unpipelined(model, ref, inputs, targets, loss)


def _moved(schedule, device, action, before):
    """``schedule`` with ``action`` moved on ``device`` to just before ``before``."""
    row = [a for a in schedule.actions[device] if a != action]
    row.insert(row.index(before), action)
    rows = list(schedule.actions)
    rows[device] = row
    return schedule.replace(actions=rows)


def _first(schedule, kind):
    for device, row in enumerate(schedule.actions):
        for action in row:
            if action.kind is kind and pool_groups(schedule).role(action.stage) == "backward":
                return device, action
    raise AssertionError(f"no {kind} in a backward job")


def test_rt_pool_split_backward_refuses_w_before_its_i():
    schedule = _split_schedule()
    device, w = _first(schedule, Kind.W)
    bad = _moved(schedule, device, w, Action(w.stage, Kind.I, w.microbatch))
    # the moved W waits for its own I, which now runs after it on the same device
    with pytest.raises(ValueError, match=rf"deadlock: worker {device} waits at {w} for \(I, {w.stage}, {w.microbatch}\)"):
        _pipe(tiny_model(8), bad)


def test_rt_pool_split_backward_refuses_store_before_the_jobs_last_w():
    schedule = _split_schedule()
    device, w = _first(schedule, Kind.W)
    row = schedule.actions[device]
    last_w = [a for a in row if a.stage == w.stage and a.kind is Kind.W][-1]
    bad = _moved(schedule, device, Action(w.stage, Kind.STORE), last_w)
    with pytest.raises(ValueError, match=f"job {w.stage} needs exactly one STORE on device {device}, after its last"):
        _pipe(tiny_model(8), bad)


def test_rt_pool_split_backward_counts_what_w_keeps_until_it_runs_and_frees_it():
    """Each W gives back the bytes its I left counted (the deferred linears' inputs and output gradients,
    more than nothing); after every step the devices hold nothing, and the peak does not grow over steps."""
    schedule = _split_schedule()
    model = tiny_model(8)
    pipe = _pipe(model, schedule)
    freed = []

    def watched_w(worker, action, state):
        deferred = worker.deferred[(action.stage, action.microbatch)]
        held, before = deferred.held, worker.budget.used
        pool_worker.backward_weight(worker, action, state)
        freed.append((action, held, before - worker.budget.used, len(deferred.queue)))

    pipe.interpreter = pipe.interpreter.with_handler(Kind.W, watched_w)
    peaks = []
    for _ in range(3):
        freed.clear()
        pipe.step(*tiny_batch(8))
        assert len(freed) == sum(a.kind is Kind.W for _, _, a in schedule.all_actions())
        assert all(held > 0 and gone == held and left == 0 for _, held, gone, left in freed), freed
        assert [w.budget.used for w in pipe.workers] == [0, 0]
        assert all(not w.deferred and not w.reserved for w in pipe.workers)
        peaks.append([w.budget.peak for w in pipe.workers])
    assert peaks[0] == peaks[1] == peaks[2]
    # a backward job of one Block holds its linear's input and output gradient: 2 x (2 rows x 8 floats)
    groups = pool_groups(schedule)
    one_block = [held for a, held, _, _ in freed if groups.role(a.stage) == "backward"
                 and len(groups.layers(a.stage)) == 1 and groups.layers(a.stage).start > 0]
    assert one_block and set(one_block) == {2 * 2 * 8 * 4}


def test_rt_pool_split_backward_budget_refuses_what_w_would_keep():
    """The bytes W keeps count against memory_budget: a budget that fits B (everything freed at once)
    is exceeded when every I's leftovers wait for the Ws at the end of their job."""
    from bubbleless_offload import DeviceOutOfMemory

    plain = Schedule.from_text(SCHEDULES["whole"])
    rows = []
    for row in plain.actions:  # every B as I, each job's W all at the end of the job, before its STORE
        out, pending = [], []
        for a in row:
            if a.kind is Kind.B:
                out.append(Action(a.stage, Kind.I, a.microbatch))
                pending.append(Action(a.stage, Kind.W, a.microbatch))
            elif a.kind is Kind.STORE:
                out += pending + [a]
                pending = []
            else:
                out.append(a)
        rows.append(out)
    late_w = plain.replace(actions=rows)
    width, batch = 16, 4 * 64
    inputs, targets = tiny_batch(batch, width=width)
    probe = RoundRobinPipeline(tiny_model(8, width=width), devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                               schedule=plain, timeout=60)
    probe.step(inputs, targets)
    budget = max(w.budget.peak for w in probe.workers)
    RoundRobinPipeline(tiny_model(8, width=width), devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                       schedule=plain, memory_budget=budget, timeout=60).step(inputs, targets)
    late = RoundRobinPipeline(tiny_model(8, width=width), devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                              schedule=late_w, memory_budget=budget, timeout=60)
    with pytest.raises(DeviceOutOfMemory):  # uncounted, W's tensors would leave the peak as B's
        late.step(inputs, targets)
    with pytest.MonkeyPatch.context() as patch:  # and indeed: held at 0 bytes, the late schedule fits
        patch.setattr(pool_split.Deferred, "hold", _hold_nothing)
        RoundRobinPipeline(tiny_model(8, width=width), devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                           schedule=late_w, memory_budget=budget, timeout=60).step(inputs, targets)


def _hold_nothing(deferred, budget, what: str) -> int:
    """``Deferred.hold`` reserving nothing: what the pool would count if it forgot what W keeps."""
    deferred.noted.clear()
    deferred.held, deferred.input_done = 0, True
    return 0


def test_rt_pool_split_backward_hf_lora_two_devices():
    """A tiny Qwen3 with LoRA: W computes only the adapters' weight gradients (the frozen base linears
    queue nothing), the fused head runs chunk by chunk outside the deferral, gradients equal unpipelined."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.dirname(__file__))  # the Hugging Face helpers beside this file
    from test_rt_pool_hf import _assert_loss_and_grads_match, _batch, _models

    piped, ref = _models("qwen3", lora=True)
    frozen = {n: p.detach().clone() for n, p in piped.model.named_parameters() if not p.requires_grad}
    schedule = _split_schedule("qwen3-lora")
    pipe = RoundRobinPipeline(piped.layers, devices=CPU2, num_microbatches=M, loss_fn=piped.loss_fn,
                              schedule=schedule, timeout=120)
    ids, labels = _batch()
    _assert_loss_and_grads_match(piped, ref, pipe.step(ids, labels), ids, labels)
    after = dict(piped.model.named_parameters())
    assert frozen and all(torch.equal(after[n], before) for n, before in frozen.items())  # host copies untouched
    assert all(after[n].grad is None for n in frozen)  # and no gradient given to them
    assert [w.budget.used for w in pipe.workers] == [0, 0]


def test_rt_pool_auto_plan_runs_a_pinned_split_backward():
    """``partition=`` a profile (as ``"auto"`` measures one) with ``split_backward=True`` pinned (whether the
    generator would split here on its own is its choice): the pool plans a split schedule and runs it exactly."""
    from bubbleless_partition import LayerCost, Profile

    head = LayerCost(name="head", forward=3.0, input_grad=3.0, weight_grad=3.0)
    body = tuple(LayerCost(name=f"layer{i}", forward=1.0, input_grad=1.3, weight_grad=1.3) for i in range(7))
    model, ref = tiny_model(8), tiny_model(8)
    pipe = RoundRobinPipeline(model, devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                              partition=Profile(layers=body + (head,)), schedule_options={"split_backward": True},
                              timeout=60)
    assert {Kind.I, Kind.W} <= {a.kind for _, _, a in pipe.schedule.all_actions()}, pipe.schedule.render()
    inputs, targets = tiny_batch(8)
    loss = pipe.step(inputs, targets)
    _assert_unpipelined(model, ref, inputs, targets, loss)
    assert pipe.predicted_timeline().makespan > 0
