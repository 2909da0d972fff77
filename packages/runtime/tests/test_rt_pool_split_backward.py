"""RoundRobinPipeline running split-backward schedules (I, then W deferred into waits): the unpipelined
model's loss and gradients (plain blocks, a fused group split over devices, a device ending a later-started
job first, a tiny HF model with LoRA),
bad orders refused before running, and what a deferred W keeps counted until it runs and then freed."""

import os
import sys

import pytest

from bubbleless_runtime import pool_worker
from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import Action, Costs, Kind, generate
from bubbleless_schedules.generators.roundrobin_search import dispatched
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups

CPU2 = ["cpu", "cpu"]
M = 4
LAYER_COSTS = Costs([1.0] * 7 + [3.0], [1.2] * 7 + [3.0], [1.2] * 7 + [3.0], 0.1)
CUT = {"forward_stages": [3, 3], "last_layers": 2, "backward_stages": [1, 1, 2, 2]}


def _split_schedule(num_devices=2, layer_costs=LAYER_COSTS, **cut):
    schedule = generate("roundrobin", num_ranks=num_devices, num_microbatches=M, layer_costs=layer_costs,
                        split_backward=True, **cut)
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
    schedule = _split_schedule(**(CUT if cut == "pinned" else {}))
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
    groups = PoolGroups((3, 3), 2, (1, 1, 2, 2))
    schedule, _, _ = dispatched(groups, LAYER_COSTS, num_devices=2, num_microbatches=M, ahead=1, split_backward=True,
                                split_job=("last", "interleaved"))
    last = groups.last_stage
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
    """The generator's own plan where a device recomputes its next job early, then runs its part of the
    split fused group from start to STORE before that job ends: the pool prefetches within two jobs'
    weights (``pool_worker._prefetch``) and the gradients are the unpipelined model's."""
    layer_costs = Costs([1.0] * 8, [1.0] * 8, [1.0] * 8, 0.1)
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=M, layer_costs=layer_costs)
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
    schedule = _split_schedule(**CUT)
    device, w = _first(schedule, Kind.W)
    bad = _moved(schedule, device, w, Action(w.stage, Kind.I, w.microbatch))
    with pytest.raises(ValueError, match="deadlock"):
        _pipe(tiny_model(8), bad)


def test_rt_pool_split_backward_refuses_store_before_the_jobs_last_w():
    schedule = _split_schedule(**CUT)
    device, w = _first(schedule, Kind.W)
    row = schedule.actions[device]
    last_w = [a for a in row if a.stage == w.stage and a.kind is Kind.W][-1]
    bad = _moved(schedule, device, Action(w.stage, Kind.STORE), last_w)
    with pytest.raises(ValueError, match=f"job {w.stage} needs exactly one STORE on device {device}, after its last"):
        _pipe(tiny_model(8), bad)


def test_rt_pool_split_backward_counts_what_w_keeps_until_it_runs_and_frees_it():
    """Each W gives back the bytes its I left counted (the deferred linears' inputs and output gradients,
    more than nothing); after every step the devices hold nothing, and the peak does not grow over steps."""
    schedule = _split_schedule(**CUT)
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

    groups = PoolGroups((3, 3), 2, (1, 1, 2, 2))
    plain, _, _ = dispatched(groups, LAYER_COSTS, num_devices=2, num_microbatches=M, ahead=1)
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


def test_rt_pool_split_backward_hf_lora_two_devices():
    """A tiny Qwen3 with LoRA: W computes only the adapters' weight gradients (the frozen base linears
    queue nothing), the fused head runs chunk by chunk outside the deferral, gradients equal unpipelined."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.dirname(__file__))  # the Hugging Face helpers beside this file
    from test_rt_pool_hf import _assert_loss_and_grads_match, _batch, _models

    piped, ref = _models("qwen3", lora=True)
    layer_costs = Costs([1.0] * 5 + [2.0], [1.0] * 5 + [2.0], [1.0] * 5 + [2.0], 0.1)
    schedule = generate("roundrobin", num_ranks=2, num_microbatches=M, layer_costs=layer_costs, split_backward=True,
                        forward_stages=[2, 2], last_layers=2, backward_stages=[1, 2, 1])
    assert Kind.W in {a.kind for _, _, a in schedule.all_actions()}
    pipe = RoundRobinPipeline(piped.layers, devices=CPU2, num_microbatches=M, loss_fn=piped.loss_fn,
                              schedule=schedule, timeout=120)
    ids, labels = _batch()
    _assert_loss_and_grads_match(piped, ref, pipe.step(ids, labels), ids, labels)
    assert all(p.grad is None for p in piped.model.parameters() if not p.requires_grad)
    assert [w.budget.used for w in pipe.workers] == [0, 0]


def test_rt_pool_auto_plan_runs_the_split_the_generator_chose():
    """``partition=`` a profile (as ``"auto"`` measures one): the layer-cost generator, left at its default,
    splits the backward where it simulates faster; the pool plans that schedule and runs it exactly."""
    from bubbleless_partition import LayerCost, Profile

    head = LayerCost(name="head", forward=3.0, input_grad=3.0, weight_grad=3.0)
    body = tuple(LayerCost(name=f"layer{i}", forward=1.0, input_grad=1.3, weight_grad=1.3) for i in range(7))
    model, ref = tiny_model(8), tiny_model(8)
    pipe = RoundRobinPipeline(model, devices=CPU2, num_microbatches=M, loss_fn=tiny_loss,
                              partition=Profile(layers=body + (head,)), timeout=60)
    assert {Kind.I, Kind.W} <= {a.kind for _, _, a in pipe.schedule.all_actions()}, pipe.schedule.render()
    inputs, targets = tiny_batch(8)
    loss = pipe.step(inputs, targets)
    _assert_unpipelined(model, ref, inputs, targets, loss)
    assert pipe.predicted_timeline().makespan > 0
