"""RoundRobinPipeline with the one-step-stale host optimizer: equal to plain torch AdamW on the unpipelined
model applying each step's gradients one step late; accumulation, drain, errors, bad options."""

import copy
import os
import sys
import threading

import pytest
import torch
from torch import nn

from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_model
from bubbleless_runtime._testing import tiny_loss as tiny_loss_fn
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_worker import POOL, store
from bubbleless_schedules import Kind
from bubbleless_schedules.roundrobin_layout import PoolGroups

CUT = PoolGroups((3, 2), 2, (1, 2, 2))
SETTINGS = {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "max_grad_norm": 0.5}


def _pool(model, cut=CUT, **optimizer):
    return RoundRobinPipeline(model, devices=["cpu"] * 4, num_microbatches=4, loss_fn=tiny_loss_fn, partition=cut,
                              optimizer={**SETTINGS, **optimizer}, timeout=60)


def _plain(model):
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-2)


class DelayedReference:
    """Plain torch AdamW over ``masters``; each step's gradients taken on ``running``, which holds the
    weights before the previous step's update (what the one-step-stale pool computes on)."""

    def __init__(self, model):
        self.masters, self.running = copy.deepcopy(model), copy.deepcopy(model)
        self.plain = _plain(self.masters)

    def step(self, inputs, targets, *, apply: bool = True):
        _, grads = reference_grads(self.running, inputs, targets, 4)
        for name, p in self.masters.named_parameters():
            p.grad = grads[name] if p.grad is None else p.grad + grads[name]
        if not apply:
            return
        next_weights = copy.deepcopy(self.masters.state_dict())  # every update but this one
        torch.nn.utils.clip_grad_norm_(self.masters.parameters(), 0.5)
        self.plain.step()
        self.plain.zero_grad()
        self.running.load_state_dict(next_weights)


def _assert_weights(model, want, tolerance=1e-5):
    errors = {n: relative_error(p.detach(), w.detach()) for (n, p), w in
              zip(model.named_parameters(), want.parameters(), strict=True)}
    assert max(errors.values()) <= tolerance, errors


def test_rt_pool_async_weights_after_k_steps_equal_plain_adamw_applying_gradients_one_step_late():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=True)
    results = []
    for seed in (1, 2, 3, 4):
        inputs, targets = tiny_batch(8, seed=seed)
        pipe.step(inputs, targets)
        reference.step(inputs, targets)
        results.append(pipe.last_step_result)
        _assert_weights(model, reference.running)  # the weights the next step runs on
    assert results[0] is None and all(r is not None and not r.skipped for r in results[1:])
    final = pipe.synchronize()
    assert final is pipe.last_step_result and final is not results[-1]
    _assert_weights(model, reference.masters)
    # and not what the synchronous optimizer reaches on the same batches: the test can tell them apart
    synchronous, plain = tiny_model(7), tiny_model(7)
    sync_pipe, sync_plain = _pool(synchronous), _plain(plain)
    for seed in (1, 2, 3, 4):
        inputs, targets = tiny_batch(8, seed=seed)
        sync_pipe.step(inputs, targets)
        reference_grads(plain, inputs, targets, 4)
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
        sync_plain.step()
        sync_plain.zero_grad()
    _assert_weights(synchronous, plain)  # sync mode unchanged
    assert max(relative_error(a.detach(), b.detach()) for a, b in
               zip(model.parameters(), synchronous.parameters(), strict=True)) > 1e-3


def test_rt_pool_async_drained_optimizer_state_equals_plain_adamw_after_the_same_updates():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=True)
    for seed in (1, 2, 3):
        inputs, targets = tiny_batch(8, seed=seed)
        pipe.step(inputs, targets)
        reference.step(inputs, targets)
    state = pipe.optimizer.state_dict()["optimizer"]  # drains: the third update is applied first
    assert not pipe.optimizer.in_flight
    want = reference.plain.state_dict()
    assert [g["params"] for g in state["param_groups"]] == [g["params"] for g in want["param_groups"]]
    # both optimizers list the parameters in model order, matrices first: state index i is the same one
    assert len(state["state"]) == len(want["state"]) == len(list(model.parameters()))
    for index, theirs in want["state"].items():
        mine = state["state"][index]
        assert float(mine["step"]) == float(theirs["step"]) == 3.0
        for key in ("exp_avg", "exp_avg_sq"):
            assert relative_error(mine[key], theirs[key]) <= 1e-5, (index, key)
    masters = pipe.store.master_state_dict()
    for (name, want_param), hp in zip(reference.masters.named_parameters(), pipe.store.trainable, strict=True):
        assert relative_error(masters[hp.name], want_param.detach()) <= 1e-5, name


def test_rt_pool_gradient_accumulation_without_an_optimizer_step_sync_and_async():
    for asynchronous in (False, True):
        model = tiny_model(7)
        reference = DelayedReference(tiny_model(7))
        pipe = _pool(model, asynchronous=asynchronous)
        halves = [tiny_batch(8, seed=s) for s in (5, 6)]
        pipe.step(*halves[0], optimizer_step=False)
        pipe.step(*halves[1])
        reference.step(*halves[0], apply=False)
        reference.step(*halves[1])
        pipe.synchronize()
        _assert_weights(model, reference.masters)


def _failing_after_store(nth: int):
    """The pool's handlers, but the ``nth`` STORE of any device raises once it has added its gradients."""
    calls, lock = [0], threading.Lock()

    def failing(worker, action, state):
        store(worker, action, state)
        with lock:
            calls[0] += 1
            hit = calls[0] == nth
        if hit:
            raise RuntimeError("store exploded on purpose")

    return POOL.with_handler(Kind.STORE, failing)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_rt_pool_failed_step_drops_the_gradients_it_stored_and_those_accumulated_before(asynchronous):
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=asynchronous)
    batches = [tiny_batch(8, seed=s) for s in (5, 6, 7)]
    pipe.step(*batches[0], optimizer_step=False)  # accumulated in the host, not applied
    assert any(hp.grad.any() for hp in pipe.store.trainable)
    pipe.interpreter = _failing_after_store(2)  # one job's gradients are down when the step fails
    with pytest.raises(RuntimeError, match="store exploded on purpose"):
        pipe.step(*batches[1])
    assert not any(hp.grad.any() for hp in pipe.store.trainable)  # both dropped, as the docstring says
    pipe.interpreter = POOL
    pipe.step(*batches[2])  # trains on its own batch alone
    reference.step(*batches[2])
    pipe.synchronize()
    _assert_weights(model, reference.masters)


ARMED = {"on": False}  # module state, not an attribute: devices run copies of the layer (shells)


class FailWhen(nn.Module):
    """Passes its input through, or raises while ``ARMED``."""

    def forward(self, activation):
        if ARMED["on"]:
            raise RuntimeError("layer exploded on purpose")
        return activation


def test_rt_pool_async_failed_step_neither_loses_nor_repeats_the_update_in_flight():
    model = tiny_model(6)
    model.insert(3, FailWhen())
    reference = DelayedReference(copy.deepcopy(model))
    pipe = _pool(model, PoolGroups((2, 3), 2, (2, 2, 1)), asynchronous=True)
    batches = [tiny_batch(8, seed=s) for s in (1, 2, 3, 4)]
    pipe.step(*batches[0])
    reference.step(*batches[0])
    before = copy.deepcopy(model.state_dict())
    ARMED["on"] = True
    try:
        with pytest.raises(RuntimeError, match="exploded on purpose"):
            pipe.step(*batches[1])
    finally:
        ARMED["on"] = False
    assert pipe.optimizer.in_flight  # the first step's update was not touched
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for inputs, targets in batches[2:]:  # the failed step's batch is simply absent
        pipe.step(inputs, targets)
        reference.step(inputs, targets)
    pipe.synchronize()
    _assert_weights(model, reference.masters)


def test_rt_pool_async_optimizer_thread_error_is_raised_by_the_next_step_and_training_goes_on(monkeypatch):
    model = tiny_model(7)
    pipe = _pool(model, asynchronous=True)
    inputs, targets = tiny_batch(8, seed=1)

    def explode():
        raise RuntimeError("optimizer exploded on purpose")

    monkeypatch.setattr(pipe.optimizer._stepper, "step", explode)
    front = copy.deepcopy(model.state_dict())
    pipe.step(inputs, targets)
    with pytest.raises(RuntimeError, match="optimizer exploded on purpose") as caught:
        pipe.step(inputs, targets)
    assert any("host optimizer thread" in note for note in caught.value.__notes__)
    assert all(torch.equal(v, front[k]) for k, v in model.state_dict().items())
    assert all(not hp.grad.any() for hp in pipe.store.trainable)  # the step that raised dropped its gradients
    monkeypatch.undo()
    pipe.step(inputs, targets)
    assert not pipe.synchronize().skipped
    assert any(not torch.equal(v, front[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("options, message", [
    ({"async": True}, r"spelled 'asynchronous'.*pass \{'asynchronous': True"),
    ({"asynchronous": "yes"}, "'asynchronous' must be True or False"),
    ({"nme": "adamw"}, r"optimizer options \['lr', 'nme'\].*the settings are HostOptimizer's"),
])
def test_rt_pool_bad_optimizer_options_say_what_to_change(options, message):
    with pytest.raises(ValueError, match=message):
        RoundRobinPipeline(tiny_model(5), devices=["cpu"] * 2, num_microbatches=2, loss_fn=tiny_loss_fn,
                           partition=PoolGroups((2,), 3, (2,)), optimizer={"lr": 1e-3, **options}, timeout=60)


def test_rt_pool_async_lora_on_a_tiny_qwen3_equals_adamw_applying_gradients_one_step_late():
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    sys.path.insert(0, os.path.dirname(__file__))  # the Hugging Face helpers beside this file
    from test_rt_pool_hf import CUT as HF_CUT
    from test_rt_pool_hf import M, _batch, _models, _reference, _trainable, plain_adamw

    piped, masters = _models("qwen3", lora=True)
    running = copy.deepcopy(masters)
    options = {"name": "adamw", "lr": 3e-3, "betas": (0.9, 0.95), "weight_decay": 0.01, "max_grad_norm": 1.0}
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 3, num_microbatches=M, loss_fn=piped.loss_fn,
                              partition=HF_CUT, optimizer={**options, "asynchronous": True}, timeout=120)
    assert all(hp.spare_working is None for hp in pipe.store.params if not hp.trainable)  # frozen: one copy
    frozen = {n: p.detach().clone() for n, p in piped.model.named_parameters() if not p.requires_grad}
    params = [p for _, p in _trainable(masters)]
    plain = plain_adamw(params)
    for seed in (1, 2, 3):
        ids, labels = _batch(seed)
        pipe.step(ids, labels)
        for _, p in _trainable(running):
            p.grad = None
        _reference(running, ids, labels)
        next_weights = [p.detach().clone() for p in params]
        for (_, p), (_, r) in zip(_trainable(masters), _trainable(running), strict=True):
            p.grad = r.grad.clone()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        plain.step()
        plain.zero_grad()
        with torch.no_grad():
            for (_, r), w in zip(_trainable(running), next_weights, strict=True):
                r.copy_(w)
        got, want = dict(_trainable(piped)), dict(_trainable(running))
        assert max(relative_error(got[n].detach(), want[n].detach()) for n in want) <= 1e-5
    pipe.synchronize()
    got, want = dict(_trainable(piped)), dict(_trainable(masters))
    assert max(relative_error(got[n].detach(), want[n].detach()) for n in want) <= 1e-5
    assert all(torch.equal(p, frozen[n]) for n, p in piped.model.named_parameters() if not p.requires_grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: pinned back buffers, real streams")
def test_rt_pool_async_on_a_gpu_uploads_from_pinned_back_buffers_and_equals_the_delayed_reference():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = RoundRobinPipeline(model, devices=["cuda:0"] * 2, num_microbatches=4, loss_fn=tiny_loss_fn,
                              partition=CUT, optimizer={**SETTINGS, "asynchronous": True}, timeout=120)
    assert all(hp.spare_working.is_pinned() and hp.param.data.is_pinned() for hp in pipe.store.trainable)
    for seed in (1, 2, 3):
        inputs, targets = tiny_batch(8, seed=seed)
        pipe.step(inputs, targets)
        reference.step(inputs, targets)
        _assert_weights(model, reference.running, tolerance=1e-4)  # GPU matmuls round differently
        assert all(hp.param.data.is_pinned() for hp in pipe.store.trainable)  # the swapped-in buffer too
    pipe.synchronize()
    _assert_weights(model, reference.masters, tolerance=1e-4)
