"""RoundRobinPipeline on CPU devices: the unpipelined model's gradients, host optimizer steps, errors."""

import copy
import os
import sys

import pytest
import torch
from torch import nn

from bubbleless_offload import DeviceOutOfMemory
from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import Schedule, generate
from bubbleless_schedules.roundrobin_layout import PoolGroups

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool_plan_cap import _best_cut_makespan  # noqa: E402

CPU4 = ["cpu"] * 4


def _pool(model, groups, devices=CPU4, m=4, **kwargs):
    kwargs.setdefault("timeout", 60)
    return RoundRobinPipeline(model, devices=devices, num_microbatches=m, loss_fn=kwargs.pop("loss_fn", tiny_loss),
                              partition=groups, **kwargs)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model, ref, inputs, targets, m, loss):
    want_loss, want = reference_grads(ref, inputs, targets, m)
    got = _grads(model)
    assert set(got) == set(want)
    errors = {n: relative_error(got[n], want[n]) for n in want}
    assert max(errors.values()) <= 1e-5, errors
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


CUTS = {
    # forward groups, last group, backward groups: forward and backward boundaries differ on purpose
    "asymmetric": PoolGroups((3, 2), 2, (1, 2, 2)),
    "one-forward-group": PoolGroups((5,), 2, (2, 1, 1, 1)),
    "all-fused": PoolGroups((), 7, ()),
    "default": None,
}


@pytest.mark.parametrize("cut", list(CUTS))
def test_rt_pool_gradients_equal_unpipelined(cut):
    model, ref = tiny_model(7), tiny_model(7)
    inputs, targets = tiny_batch(8)
    pipe = _pool(model, CUTS[cut])
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


def test_rt_pool_two_devices_and_repeated_steps_accumulate_like_backward():
    model, ref = tiny_model(6), tiny_model(6)
    inputs, targets = tiny_batch(6)
    pipe = _pool(model, PoolGroups((2, 2), 2, (3, 1)), devices=["cpu", "cpu"], m=3)
    pipe.step(inputs, targets)
    pipe.step(inputs, targets)  # .grad accumulates across steps, as two loss.backward() calls would
    _, want = reference_grads(ref, inputs, targets, 3)
    for name, p in model.named_parameters():
        assert relative_error(p.grad, 2 * want[name]) <= 1e-5


def test_rt_pool_host_adamw_equals_plain_adamw_after_three_steps():
    model, ref = tiny_model(7), tiny_model(7)
    batches = [tiny_batch(8, seed=s) for s in (1, 2, 3)]
    pipe = _pool(model, CUTS["asymmetric"], optimizer={"name": "adamw", "lr": 1e-2, "weight_decay": 0.1,
                                                       "max_grad_norm": 0.5})
    params = list(ref.parameters())
    plain = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                               {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-2)
    for inputs, targets in batches:
        pipe.step(inputs, targets)
        plain.zero_grad()
        reference_grads(ref, inputs, targets, 4)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        plain.step()
    for (name, got), want in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert relative_error(got.detach(), want.detach()) <= 1e-5, name


class Tied(nn.Module):
    """First and last layer share one weight, as a tied embedding and LM head do."""

    def __init__(self, weight, first):
        super().__init__()
        self.weight, self.first = weight, first

    def forward(self, x):
        return x @ (self.weight if self.first else self.weight.t())


def test_rt_pool_tied_weight_gradients_sum_over_both_jobs():
    torch.manual_seed(0)
    shared = nn.Parameter(torch.randn(8, 8) / 3)
    body = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)]
    model = nn.Sequential(Tied(shared, True), *body, Tied(shared, False))
    ref = copy.deepcopy(model)
    inputs, targets = tiny_batch(8)

    def loss_fn(out, y):
        return nn.functional.mse_loss(out, y, reduction="sum")

    pipe = _pool(model, PoolGroups((2, 2), 2, (1, 3)), loss_fn=loss_fn)
    pipe.step(inputs, targets)
    _, want = reference_grads(ref, inputs, targets, 4, loss_fn=loss_fn)
    got = _grads(model)
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-5


def test_rt_pool_hand_edited_csv_schedule_runs(tmp_path):
    """The schedule is data here too: saved, edited (job 1 moved to device 3, LOAD/STORE removed), run."""
    generated = Schedule.from_text(  # job k on device k mod 4, without LOAD/STORE
        "# bubbleless-schedule name=roundrobin stages=6 microbatches=4 layout=roundrobin meta.forward_layers=3,2 "
        "meta.last_layers=2 meta.backward_layers=1,2,2\n"
        "0F0 0F1 0F2 0F3 4R0 4B0 4R1 4B1 4R2 4B2 4R3 4B3\n1F0 1F1 1F2 1F3 5R0 5B0 5R1 5B1 5R2 5B2 5R3 5B3\n"
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3\n3R0 3B0 3R1 3B1 3R2 3B2 3R3 3B3\n")
    rows = [list(r) for r in generated.actions]
    moved = [a for a in rows[1] if a.stage == 1]
    rows[1] = [a for a in rows[1] if a.stage != 1]
    rows[3] = moved + rows[3]
    path = tmp_path / "edited.csv"
    generated.replace(actions=rows).to_csv(path)
    edited = Schedule.from_csv(path)
    model, ref = tiny_model(7), tiny_model(7)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=CPU4, num_microbatches=4, loss_fn=tiny_loss, schedule=edited)
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)
    row3 = pipe.schedule.actions[3]
    assert [a.kind.value for a in row3 if a.stage == 1][0] == "LOAD"  # the moved job's weights come first there
    assert not any(a.stage == 1 for a in pipe.schedule.actions[1])  # and it left device 1
    assert {s.worker for s in pipe.last_timeline.spans if s.action.stage == 1} == {3}  # where it ran


CALLS = {"count": 0}
"""Calls of every FailOn, kept outside the module: the pool runs per-device copies of each layer."""


class FailOn(nn.Module):
    """Raises on the ``fail_at``-th call of any FailOn; otherwise the identity."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at = fail_at

    def forward(self, activation):
        CALLS["count"] += 1
        if CALLS["count"] == self.fail_at:
            raise RuntimeError("layer exploded on purpose")
        return activation


def test_rt_pool_failing_layer_raises_from_step_and_next_step_works():
    model, ref = tiny_model(6), tiny_model(6)
    CALLS["count"] = 0
    model.insert(3, FailOn(fail_at=3))
    ref.insert(3, FailOn(fail_at=0))
    inputs, targets = tiny_batch(8)
    pipe = _pool(model, PoolGroups((2, 3), 2, (2, 2, 1)))
    with pytest.raises(RuntimeError, match="exploded on purpose") as caught:
        pipe.step(inputs, targets)
    assert any("round-robin pool running" in note for note in getattr(caught.value, "__notes__", []))
    assert all(p.grad is None for p in model.parameters())  # the failed step left no gradients
    assert all(w.weights.resident_bytes == 0 for w in pipe.workers)
    assert all(w.budget.used == 0 for w in pipe.workers)  # the failing forward's uploaded input too
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


def test_rt_pool_failing_loss_is_a_clear_error_and_next_step_works():
    model, ref = tiny_model(5), tiny_model(5)
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        value = tiny_loss(out, y)
        return value.expand(2) if len(calls) == 2 else value

    pipe = _pool(model, PoolGroups((2,), 3, (2,)), loss_fn=loss_fn)
    inputs, targets = tiny_batch(8)
    with pytest.raises(ValueError, match="scalar Tensor"):
        pipe.step(inputs, targets)
    loss = pipe.step(inputs, targets)  # the failed step's partial gradients are not in this one's
    _assert_same(model, ref, inputs, targets, 4, loss)


def test_rt_pool_budget_refused_before_running_with_numbers():
    model = tiny_model(7, width=64)
    with pytest.raises(ValueError, match=r"does not fit memory_budget=.*device \d .*needs .*Raise memory_budget"):
        _pool(model, CUTS["asymmetric"], memory_budget=20_000)


def test_rt_pool_budget_exceeded_while_running_says_what_to_change():
    model = tiny_model(7, width=64)
    # room for the weights (no profile: activations are only counted at run time), not for a large batch
    pipe = _pool(model, CUTS["asymmetric"], memory_budget=200_000)
    inputs, targets = tiny_batch(4 * 200, width=64)
    with pytest.raises(DeviceOutOfMemory) as caught:
        pipe.step(inputs, targets)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "more micro-batches" in notes and "tried: groups" in notes
    small = tiny_batch(8, width=64)
    pipe.step(*small)  # a batch that fits still runs


def test_rt_pool_refuses_stage_bound_schedule_and_bad_devices():
    with pytest.raises(ValueError, match="round-robin pool schedules"):
        RoundRobinPipeline(tiny_model(4), devices=["cpu", "cpu"], num_microbatches=2, loss_fn=tiny_loss,
                           schedule=generate("1f1b", num_ranks=2, num_microbatches=2))
    with pytest.raises(ValueError, match="non-empty list"):
        RoundRobinPipeline(tiny_model(4), devices="cpu", num_microbatches=2, loss_fn=tiny_loss)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no GPU is visible"):
            RoundRobinPipeline(tiny_model(4), devices=["cuda:0"], num_microbatches=2, loss_fn=tiny_loss)


def test_rt_pool_auto_partition_profiles_and_matches_gradients():
    model, ref = tiny_model(9), tiny_model(9)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              partition="auto", sample_input=inputs.chunk(4)[0])
    assert pipe.profile is not None and pipe.groups.num_layers == 9
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)
    kinds = {span.action.kind.value for span in pipe.last_timeline.spans}
    assert kinds >= {"LOAD", "F"} and ("B" in kinds or {"I", "W"} <= kinds)  # the generator picks B or I/W


def test_rt_pool_prefetches_the_next_job_and_never_holds_three():
    """Each LOAD brings the device's next job too (weights of two jobs at once), and never more."""
    model = tiny_model(8)
    pipe = _pool(model, PoolGroups((2, 2, 2), 2, (1, 1, 2, 2)), devices=["cpu", "cpu"])
    live = {w.index: [] for w in pipe.workers}
    for worker in pipe.workers:
        original = worker.weights.load

        def load(layers, view=None, worker=worker, original=original):
            job = original(layers, view)
            live[worker.index].append(len(worker.weights._live))
            return job

        worker.weights.load = load
    pipe.step(*tiny_batch(8))
    for index, counts in live.items():
        assert max(counts) == 2, (index, counts)
    assert all(w.weights.resident_bytes == 0 for w in pipe.workers)


def test_rt_pool_profiles_one_layer_copy_at_a_time_and_leaves_the_callers_layers():
    """partition='auto' times each layer on the pool's device from a copy (the model need not fit there)."""
    from bubbleless_runtime.pool_plan import OneLayerOnDevice, profile_layers

    model = tiny_model(5)
    before = [p.data_ptr() for p in model.parameters()]
    slot = {}
    first, second = (OneLayerOnDevice(layer, torch.device("cpu"), slot) for layer in model[:2])
    first.to("cpu")
    assert first.copy is not None and first.copy is not model[0]
    second.to("cpu")  # the profiler moves the next layer: the previous copy goes
    assert first.copy is None and second.copy is not None
    profile = profile_layers(list(model), tiny_batch(2)[0], torch.device("cpu"))
    assert [p.data_ptr() for p in model.parameters()] == before
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert [c.param_bytes for c in profile.layers] == [sum(p.numel() * 4 for p in layer.parameters()) for layer in model]
    assert all(c.weight_grad > 0 for c in profile.layers)


def test_rt_pool_interrupt_in_the_caller_stops_every_worker_and_the_next_step_works():
    """Ctrl-C while ``step`` waits for its workers: they stop at their next wait, the devices are
    cleared, and the pipeline still runs the next step to the unpipelined gradients."""
    import os
    import signal
    import threading

    model, ref = tiny_model(7), tiny_model(7)
    inputs, targets = tiny_batch(8)
    started = threading.Event()

    class Slow(nn.Module):
        def forward(self, activation):
            started.set()
            threading.Event().wait(0.1)
            return activation

    model.insert(1, Slow())
    ref.insert(1, nn.Identity())
    pipe = _pool(model, PoolGroups((3, 3), 2, (1, 2, 3)))
    # a real SIGINT, as Ctrl-C sends: it wakes the caller blocked in join, mid-step
    timer = threading.Thread(target=lambda: (started.wait(10), os.kill(os.getpid(), signal.SIGINT)))
    # Python's own Ctrl-C handler even where this process inherited SIGINT ignored (a background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pipe.step(inputs, targets)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [w.weights.resident_bytes for w in pipe.workers] == [0] * 4
    assert all(p.grad is None for p in model.parameters())
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


RECOMPUTED_AHEAD = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=9 microbatches=4 layout=roundrobin meta.forward_layers=3,3 "
    "meta.last_layers=2 meta.backward_layers=1,1,1,1,1,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2B0 2F1 2B1 2STORE 3LOAD 3R0 3R1 3B0 3R2 3B1 3R3 3B2 3B3 3STORE 5LOAD 5R0 5B0 "
    "5R1 5B1 5R2 5B2 5R3 5B3 5STORE 7LOAD 7R0 7B0 7R1 7B1 7R2 7B2 7R3 7B3 7STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F2 2B2 2F3 2B3 2STORE 4LOAD 4R0 4B0 4R1 4B1 4R2 4B2 4R3 6LOAD 6R0 4B3 4STORE 6B0 "
    "6R1 6B1 6R2 6B2 6R3 6B3 6STORE 8LOAD 8R0 8B0 8R1 8B1 8R2 8B2 8R3 8B3 8STORE\n")
"""Written out (not generated: the generator's choice may change): the fused group dealt over both devices,
device 0 recomputing two micro-batches of job 3 ahead, device 1 job 6's first before job 4's last B."""


def _recomputes_into_the_next_job(schedule) -> bool:
    """Some device runs an R of a job before the last B of a job it started earlier."""
    return any(a.kind.value == "R" and any(b.kind.value == "B" and b.stage < a.stage for b in row[i + 1:])
               for row in schedule.actions for i, a in enumerate(row))


def _recomputes_two_ahead(schedule) -> bool:
    """Some device holds two micro-batches of one job recomputed (R) and not yet backpropagated (B)."""
    for row in schedule.actions:
        open_ = set()
        for a in row:
            if a.kind.value == "R":
                open_.add((a.stage, a.microbatch))
                if sum(stage == a.stage for stage, _ in open_) >= 2:
                    return True
            elif a.kind.value == "B":
                open_.discard((a.stage, a.microbatch))
    return False


def test_rt_pool_runs_recompute_ahead_into_the_next_job_and_two_micro_batches_ahead():
    """What ``roundrobin`` with layer_costs may emit: the next job's recompute started before the current job
    ends, and two micro-batches recomputed ahead. The pool runs that order, never holds three jobs' weights,
    and the gradients equal the unpipelined model's."""
    from bubbleless_schedules.roundrobin_layout import pool_groups

    schedule = RECOMPUTED_AHEAD
    assert _recomputes_into_the_next_job(schedule) and _recomputes_two_ahead(schedule), schedule.render()
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              schedule=schedule, partition=pool_groups(schedule), timeout=60)
    _assert_same_with_two_jobs_weights_at_most(pipe, model, ref, inputs, targets)


def test_rt_pool_auto_plan_also_tries_the_layer_cost_dispatch_and_keeps_the_faster():
    from bubbleless_partition import LayerCost, Profile
    from bubbleless_runtime import pool_plan
    from bubbleless_schedules import simulate
    from bubbleless_schedules.roundrobin_layout import pool_groups

    head = LayerCost(name="head", forward=3.0, input_grad=3.0, weight_grad=3.0)
    body = tuple(LayerCost(name=f"layer{i}", forward=1.0, input_grad=1.3, weight_grad=1.3) for i in range(7))
    profile = Profile(layers=body + (head,))
    plan = {"num_devices": 2, "num_microbatches": 4, "name": "roundrobin", "options": {}, "bandwidth": None}
    _, schedule, costs = pool_plan.auto_groups(profile, memory_cap=None, **plan)
    layer = generate("roundrobin", num_ranks=2, num_microbatches=4,
                     layer_costs=pool_plan.layer_costs_of(profile, bandwidth=None))
    layer_span = simulate(layer, pool_plan.job_costs(profile, pool_groups(layer), bandwidth=None)).makespan
    chosen = simulate(schedule, costs).makespan
    assert chosen <= min(layer_span, _best_cut_makespan(None, profile)) + 1e-9  # every DP cut, computed apart
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              partition=profile, timeout=60)
    assert pipe.groups == pool_groups(schedule)  # the pool runs the plan compared here
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


NEXT_JOB_IN_THE_WAITS = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=9 microbatches=4 layout=roundrobin meta.forward_layers=3,3 "
    "meta.last_layers=2 meta.backward_layers=1,1,1,1,1,1\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2STORE 4LOAD 4R0 4B0 4R1 4B1 4R2 4B2 4R3 4B3 4STORE "
    "6LOAD 6R0 6B0 6R1 6B1 6R2 6B2 6R3 6B3 6STORE 8LOAD 8R0 8B0 8R1 8B1 8R2 8B2 8R3 8B3 8STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 3LOAD 3R0 5LOAD 5R0 5R1 5R2 5R3 3B0 3R1 3B1 3R2 3B2 3R3 3B3 3STORE 7LOAD 7R0 5B0 7R1 5B1 "
    "7R2 5B2 7R3 5B3 5STORE 7B0 7B1 7B2 7B3 7STORE\n")
"""The layer-cost search's dispatch with the next job recomputed in the waits (``next_ahead=4``), as it
emitted it at f06d1d3, written out so the test does not follow the search's later choices."""


def test_rt_pool_runs_the_next_jobs_recompute_in_the_current_jobs_waits():
    """A device recomputes its next backward job (jobs k mod N) while the current one waits for gradients:
    the pool runs that order within two jobs' weights and matches the unpipelined gradients."""
    groups = PoolGroups((3, 3), 2, (1, 1, 1, 1, 1, 1))
    schedule = NEXT_JOB_IN_THE_WAITS
    assert any(a.kind.value == "R" and any(b.kind.value == "B" and b.stage < a.stage for b in row[i + 1:])
               for row in schedule.actions for i, a in enumerate(row)), schedule.render()
    model, ref = tiny_model(8), tiny_model(8)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              schedule=schedule, partition=groups, timeout=60)
    _assert_same_with_two_jobs_weights_at_most(pipe, model, ref, inputs, targets)


def _assert_same_with_two_jobs_weights_at_most(pipe, model, ref, inputs, targets):
    """One step equals the unpipelined model and never holds more than two jobs' weights on a device."""
    live = []
    for worker in pipe.workers:
        original = worker.weights.load

        def load(layers, view=None, worker=worker, original=original):
            job = original(layers, view)
            live.append(len(worker.weights._live))
            return job

        worker.weights.load = load
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)
    assert max(live) <= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: the pool on real device memory")
def test_rt_pool_on_a_gpu_moves_the_callers_micro_batches_and_matches_gradients():
    """Jobs at layer 0 read the caller's host micro-batch: the worker copies it to its GPU (it used to hand
    the host tensor to device weights). Two jobs' weights on one GPU, twice: a pool of two GPU workers."""
    model, ref = tiny_model(7), tiny_model(7)
    inputs, targets = tiny_batch(8)
    pipe = _pool(model, CUTS["asymmetric"], devices=["cuda:0", "cuda:0"])
    copies = _watch_layer0_copies(pipe)
    loss = pipe.step(inputs, targets)
    layer0 = sum(a.microbatch is not None and pipe.groups.layers(a.stage).start == 0 and a.kind.name in ("F", "R")
                 for row in pipe.schedule.actions for a in row)
    assert copies == [8 // 4 * 8 * 4] * layer0  # each copy of a micro-batch counted, and given back below
    assert all(w.budget.used == 0 for w in pipe.workers)
    want_loss, want = reference_grads(ref, inputs, targets, 4)
    got = _grads(model)
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-4
    assert abs(float(loss) - float(want_loss)) <= 1e-4 * abs(float(want_loss))


class _LogitsHead(nn.Module):
    """An unfused LM head: a wide Linear whose output gradient (rows x 1000) W must not keep."""

    def __init__(self, width: int = 8, vocab: int = 1000) -> None:
        super().__init__()
        self.proj = nn.Linear(width, vocab)

    def forward(self, activation):
        hidden, aux, _ = activation
        return self.proj(hidden), aux


def _logits_loss(output, target):
    logits, aux = output
    return nn.functional.mse_loss(logits[:, :target.shape[1]], target, reduction="sum") + 1e-3 * logits.pow(2).sum() \
        + 0.01 * aux.sum()


SPLIT_BACKWARD = Schedule.from_text(
    "# bubbleless-schedule name=roundrobin stages=7 microbatches=4 layout=roundrobin meta.forward_layers=3,3 "
    "meta.last_layers=2 meta.backward_layers=1,1,2,2\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2F0 2I0 2F1 2I1 2W0 2W1 2STORE 3LOAD 3R0 3I0 3R1 3I1 3W0 3R2 3I2 3W1 3R3 3I3 3W2 "
    "3W3 3STORE 5LOAD 5R0 5I0 5R1 5I1 5W0 5R2 5I2 5W1 5R3 5I3 5W2 5W3 5STORE\n"
    "1LOAD 1F0 1F1 1F2 1F3 2LOAD 2F2 2I2 2F3 2I3 2W2 2W3 2STORE 4LOAD 4R0 4I0 4R1 4I1 4W0 4R2 4I2 4W1 4R3 4I3 4W2 "
    "4W3 4STORE 6LOAD 6R0 6I0 6R1 6I1 6W0 6R2 6I2 6W1 6R3 6I3 6W2 6W3 6STORE\n")
"""``roundrobin`` with ``split_backward=True`` on this cut at f06d1d3, written out: every B as I then W."""


def test_rt_pool_split_backward_runs_an_unfused_head_outside_the_deferral():
    """Without a fused head the last group's final module (the LM head) runs outside the split backward's
    deferral, as the fused head does: after the last group's I what W keeps is the group's body only,
    never the logits-sized gradient; the gradients are the unpipelined model's."""
    from bubbleless_runtime import pool_worker
    from bubbleless_schedules import Kind

    def model():
        torch.manual_seed(3)
        return nn.Sequential(*tiny_model(7), _LogitsHead()).double().float()

    schedule = SPLIT_BACKWARD  # every micro-batch of the last group split into I and W
    net, ref = model(), model()
    pipe = RoundRobinPipeline(net, devices=["cpu", "cpu"], num_microbatches=4, loss_fn=_logits_loss, schedule=schedule,
                              timeout=60)
    held = []

    def watched_i(worker, action, state):
        pool_worker.backward_input(worker, action, state)
        if pipe.groups.role(action.stage) == "last":
            held.append(worker.deferred[(action.stage, action.microbatch)].held)

    pipe.interpreter = pipe.interpreter.with_handler(Kind.I, watched_i)
    inputs, targets = tiny_batch(8)
    loss = pipe.step(inputs, targets)
    logits_grad = 8 // 4 * 1000 * 4
    assert len(held) == 4 and all(0 < h < logits_grad for h in held), held  # the body's Block linear only
    want_loss, want = reference_grads(ref, inputs, targets, 4, loss_fn=_logits_loss)
    got = {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


def test_rt_pool_autocast_runs_without_the_cast_cache():
    """The caller's autocast reaches the workers without its cast cache: one autocast spans the step, and
    its cache would keep a low-precision copy of every weight used until the step ends, after the
    weights' release and outside the budget."""
    from bubbleless_runtime import pool_worker
    from bubbleless_schedules import Kind

    seen = []

    def watched_f(worker, action, state):
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
        pool_worker.forward(worker, action, state)

    pipe = RoundRobinPipeline(tiny_model(7), devices=["cpu", "cpu"], num_microbatches=4, loss_fn=tiny_loss,
                              partition=PoolGroups((3, 3), 1, (3, 3)), timeout=60)
    pipe.interpreter = pipe.interpreter.with_handler(Kind.F, watched_f)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = pipe.step(*tiny_batch(8))
    assert torch.isfinite(loss)
    assert seen and set(seen) == {(True, False)}, seen


def _watch_layer0_copies(pipe) -> list:
    """Bytes each worker reserves for its copy of the caller's micro-batch (a layer-0 job's input)."""
    copies = []
    for worker in pipe.workers:
        def reserve(nbytes, what, original=worker.budget.reserve):
            if what.endswith("copy of the caller's micro-batch"):
                copies.append(nbytes)
            original(nbytes, what)
        worker.budget.reserve = reserve
    return copies


def test_rt_pool_copies_of_the_callers_micro_batch_are_counted_off_cpu():
    """A layer-0 job off the CPU copies the caller's micro-batch to its device: the copy is reserved on the
    budget and its bytes returned (released as an upload's); a CPU device reads the batch as it is (0)."""
    from types import SimpleNamespace

    from bubbleless_offload import DeviceStreams, MemoryBudget, PinnedPool, WeightUploads
    from bubbleless_runtime.pool_worker import DeviceWorker

    batch = (torch.randn(2, 8), torch.zeros(2, dtype=torch.long))
    # a stand-in worker on the meta device: the staged path (a pooled host buffer, the activations stream)
    meta = SimpleNamespace(device=torch.device("meta"), budget=MemoryBudget(None, "meta"),
                           streams=DeviceStreams("cpu"), host_buffers=PinnedPool(pin=False),
                           weights=SimpleNamespace(uploads=WeightUploads(DeviceStreams("cpu"))))
    meta._caller_tensor = lambda t: DeviceWorker._caller_tensor(meta, t)
    meta._activations_in = lambda tensors: DeviceWorker._activations_in(meta, tensors)
    moved, nbytes = DeviceWorker._batch_on_device(meta, batch, "0F0's copy")
    assert nbytes == 2 * 8 * 4 + 2 * 8 and meta.budget.used == nbytes
    assert isinstance(moved, tuple) and all(t.device.type == "meta" for t in moved)
    assert meta.host_buffers.bytes_in_use == 0 and meta.host_buffers.bytes_reserved == nbytes  # staged, given back
    cpu = SimpleNamespace(device=torch.device("cpu"), streams=SimpleNamespace(compute=None),
                          budget=MemoryBudget(None, "cpu"))
    assert DeviceWorker._batch_on_device(cpu, batch, "0F0's copy") == (batch, 0) and cpu.budget.used == 0


def test_rt_pool_an_i_without_its_deferred_forward_is_a_clear_error():
    """I with nothing deferred for it on the device (its forward with a graph ran elsewhere, or not yet)
    says which action and what to put first, as W does, instead of a bare KeyError."""
    from types import SimpleNamespace

    from bubbleless_runtime import pool_worker
    from bubbleless_schedules import Action, Kind

    worker = SimpleNamespace(name="device 1", deferred={})
    with pytest.raises(ValueError, match=r"device 1: 3I0 runs without a forward with a graph of job 3 micro-batch 0"):
        pool_worker.backward_input(worker, Action(3, Kind.I, 0), state=None)
