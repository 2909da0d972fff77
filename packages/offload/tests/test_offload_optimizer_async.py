"""AsyncHostOptimizer: the one-step-stale update equals plain torch AdamW applying each step's gradients
one step late; drain points, hyper-parameters at hand-off, errors from the thread."""

from __future__ import annotations

import copy
import math
import threading
import warnings

import pytest
import torch
from offload_models import batch, loss_of, tied_layers
from test_offload_optimizer import SETTINGS, parameters, plain_optimizer

from bubbleless_offload import DynamicLossScaler, HostOptimizer, HostStore
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer


def grads_at(layers, seed: int) -> list[torch.Tensor]:
    """The gradients of batch ``seed`` at ``layers``' current weights, one per unique parameter."""
    for p in parameters(layers):
        p.grad = None
    loss_of(layers, *batch(seed)).backward()
    grads = [p.grad.clone() for p in parameters(layers)]
    for p in parameters(layers):
        p.grad = None
    return grads


def into_store(store: HostStore, grads) -> None:
    for hp, g in zip(store.trainable, grads, strict=True):
        store.accumulate(hp, g)


def delayed_reference(layers, name: str, steps: int, *, fused: bool, clip: float = 0.0):
    """Plain torch: each step's gradients taken at the weights before the previous step's update.

    Yields, per step, (the gradients it took, the weights the next step runs on); ``plain`` is left with
    every update applied (the state after a drain)."""
    masters = copy.deepcopy(layers)
    plain = plain_optimizer(masters, name, SETTINGS[name], fused=fused)
    running = copy.deepcopy(layers)  # the weights a step computes on
    history = []
    for step in range(steps):
        grads = grads_at(running, step)
        next_weights = [p.detach().clone() for p in parameters(masters)]  # every update but this one
        for p, g in zip(parameters(masters), grads, strict=True):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(parameters(masters), clip if clip > 0 else math.inf)
        plain.step()
        plain.zero_grad()
        with torch.no_grad():
            for p, w in zip(parameters(running), next_weights, strict=True):
                p.copy_(w)
        history.append((grads, next_weights))
    return masters, plain, history


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_k_steps_equal_plain_torch_applying_each_gradient_one_step_late(name):
    layers = tied_layers(seed=3)
    reference_layers, plain, history = delayed_reference(tied_layers(seed=3), name, 4, fused=False, clip=0.5)
    store = HostStore(layers, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name=name, max_grad_norm=0.5, fused=False, **SETTINGS[name])
    results = []
    for step, (grads, next_weights) in enumerate(history):
        assert [g.shape for g in grads_at(layers, step)] == [g.shape for g in grads]
        torch.testing.assert_close(grads_at(layers, step), grads, rtol=0, atol=0)  # same weights in front
        into_store(store, grads)
        results.append(optimizer.step())
        assert optimizer.in_flight
        for p, w in zip(parameters(layers), next_weights, strict=True):
            assert torch.equal(p.detach(), w)
    assert results[0] is None and all(r is not None and not r.skipped for r in results[1:])
    final = optimizer.synchronize()
    assert not optimizer.in_flight and final is optimizer.last_result and not final.skipped
    for mine, theirs in zip(parameters(layers), parameters(reference_layers), strict=True):
        assert torch.equal(mine.detach(), theirs.detach())
    # the gradient norms reported are those of the gradients each update applied
    norms = [float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) for grads, _ in history]
    assert [r.grad_norm for r in [*results[1:], final]] == pytest.approx(norms, rel=1e-6)


def test_drained_state_equals_the_synchronous_optimizer_given_the_same_gradients():
    """Async (fused kernel, the default) then state_dict: the state a synchronous HostOptimizer reaches
    applying the same gradients in the same order."""
    layers, twin = tied_layers(seed=4), tied_layers(seed=4)
    _, _, history = delayed_reference(tied_layers(seed=4), "adamw", 3, fused=False)
    store, twin_store = HostStore(layers, pin_memory=False), HostStore(twin, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="adamw", **SETTINGS["adamw"])
    synchronous = HostOptimizer(twin_store, name="adamw", **SETTINGS["adamw"])
    for grads, _ in history:
        into_store(store, grads)
        optimizer.step()
        into_store(twin_store, grads)
        synchronous.step()
    state, want = optimizer.state_dict(), synchronous.state_dict()  # state_dict drains
    assert not optimizer.in_flight
    assert state["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    for index, moments in want["optimizer"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(state["optimizer"]["state"][index][key], value), (index, key)
    masters, want_masters = store.master_state_dict(), twin_store.master_state_dict()
    assert all(torch.equal(masters[k], want_masters[k]) for k in want_masters)
    assert all(torch.equal(a, b) for a, b in zip(parameters(layers), parameters(twin), strict=True))


def test_master_state_dict_drains_the_update_in_flight():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="sgd", lr=0.5)
    before = {k: v.clone() for k, v in store.master_state_dict().items()}
    into_store(store, grads_at(layers, 0))
    optimizer.step()
    after = store.master_state_dict()
    assert not optimizer.in_flight and any(not torch.equal(after[k], before[k]) for k in before)
    assert all(torch.equal(hp.param.detach(), hp.master) for hp in store.trainable)  # swapped in front


def test_each_update_uses_the_learning_rate_in_force_at_hand_off():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="sgd", lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.torch_optimizer, lambda step: 0.5 ** step)
    start = [hp.master.clone() for hp in store.trainable]
    grads = grads_at(layers, 0)
    into_store(store, grads)
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()"
        scheduler.step()  # lr 0.5 for the next update, while this one may still run
    optimizer.synchronize()
    for hp, w, g in zip(store.trainable, start, grads, strict=True):
        torch.testing.assert_close(hp.master, w - 1.0 * g, rtol=0, atol=1e-7)
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]


def test_an_error_in_the_thread_surfaces_on_the_next_call_and_the_next_steps_work(monkeypatch):
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="sgd", lr=0.1)
    front = [hp.param.detach().clone() for hp in store.trainable]

    def explode():
        raise RuntimeError("optimizer exploded on purpose")

    monkeypatch.setattr(optimizer._stepper, "step", explode)
    into_store(store, grads_at(layers, 0))
    assert optimizer.step() is None
    with pytest.raises(RuntimeError, match="exploded on purpose") as caught:
        optimizer.synchronize()
    assert any("host optimizer thread" in note and "optimizer step 1" in note for note in caught.value.__notes__)
    assert not optimizer.in_flight and optimizer.synchronize() is None  # raised once
    assert all(torch.equal(hp.param.detach(), w) for hp, w in zip(store.trainable, front, strict=True))
    assert all(not hp.grad.any() and not hp.spare_grad.any() for hp in store.trainable)  # dropped, not kept
    monkeypatch.undo()
    grads = grads_at(layers, 1)
    into_store(store, grads)
    optimizer.step()
    result = optimizer.synchronize()
    assert result is not None and not result.skipped
    for hp, w, g in zip(store.trainable, front, grads, strict=True):
        torch.testing.assert_close(hp.param.detach(), w - 0.1 * g, rtol=0, atol=1e-7)


def test_a_nan_update_is_skipped_and_leaves_the_front_weights():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="adamw", lr=0.1)
    front = [hp.param.detach().clone() for hp in store.trainable]
    store.trainable[0].grad.fill_(math.nan)
    optimizer.step()
    result = optimizer.synchronize()
    assert result.skipped and math.isnan(result.grad_norm)
    assert all(torch.equal(hp.param.detach(), w) for hp, w in zip(store.trainable, front, strict=True))


def test_double_buffering_costs_what_the_docstring_says_and_the_thread_is_not_a_daemon(monkeypatch):
    started = []
    real_start = threading.Thread.start

    def spy(self):
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", spy)
    for dtype, per_param in ((torch.float32, 12), (torch.bfloat16, 6)):
        store = HostStore(tied_layers(dtype=dtype), pin_memory=False)
        params = sum(hp.param.numel() for hp in store.trainable)
        assert store.double_buffer() == per_param * params
        assert store.double_buffer() == 0  # idempotent
        assert all(hp.master.data_ptr() != hp.param.data_ptr() for hp in store.trainable)
        optimizer = AsyncHostOptimizer(store, name="sgd", lr=0.1)
        optimizer.step()
        optimizer.synchronize()
    assert started and not any(t.daemon for t in started)  # an exiting interpreter waits for the update


def test_the_fp16_loss_scaler_and_bad_settings_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="fp16 loss scaler.*train in bf16, or use the synchronous"):
        AsyncHostOptimizer(HostStore(tied_layers(), pin_memory=False), loss_scaler=DynamicLossScaler())
    store = HostStore(tied_layers(), pin_memory=False)
    with pytest.raises(ValueError, match="lr must be a finite number"):
        AsyncHostOptimizer(store, lr=-1.0)
    assert not store.double_buffered  # refused before the store grew its second buffers
    AsyncHostOptimizer(HostStore(tied_layers(), pin_memory=False), loss_scaler=DynamicLossScaler(enabled=False))
    with pytest.raises(ValueError, match="call double_buffer"):
        store.swap_grads()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_host_optimizer_is_built_over_the_double_buffered_masters(monkeypatch, dtype):
    """One ``HostOptimizer`` and one torch optimizer for callers, over the masters the thread steps (fp32
    parameters get new ones from ``double_buffer``): none built over masters that are then dropped."""
    import bubbleless_offload.host_optimizer_async as module

    built = []

    class Counted(HostOptimizer):
        def __init__(self, *args, **kwargs):
            built.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(module, "HostOptimizer", Counted)
    store = HostStore(tied_layers(dtype=dtype), pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="adamw", lr=0.1, fused=False)
    assert built == [optimizer.host]
    masters = [hp.master for hp in store.trainable]
    assert all(m.data_ptr() != hp.param.data_ptr() for m, hp in zip(masters, store.trainable, strict=True))
    for torch_optimizer in (optimizer.torch_optimizer, optimizer._stepper):
        stepped = [p for group in torch_optimizer.param_groups for p in group["params"]]
        assert sorted(map(id, stepped)) == sorted(map(id, masters))


def test_an_interpreter_exiting_mid_update_finishes_the_update_first(tmp_path):
    """The thread is not a daemon: ``python`` returns only after the update in flight wrote its result."""
    import subprocess
    import sys
    import textwrap

    marker = tmp_path / "finished"
    script = textwrap.dedent(f"""
        import time, torch
        from torch import nn
        from bubbleless_offload import HostStore
        from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer
        store = HostStore([nn.Linear(4, 4)], pin_memory=False)
        optimizer = AsyncHostOptimizer(store, name="sgd", lr=1.0)
        step = optimizer._stepper.step
        def slow_step():
            time.sleep(1.0)  # still running when the main thread ends
            step()
            open({str(marker)!r}, "w").write(str(float(store.trainable[0].spare_working.sum())))
        optimizer._stepper.step = slow_step
        store.trainable[0].grad.fill_(1.0)
        optimizer.step()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert marker.exists()  # the update ran to its end before the interpreter went
