"""HostView: one iteration's host tensors, so two iterations run at once (the pool's overlapped steps): a
back view uploads the back working buffers and adds into the spare accumulators, untouched by pointer
swaps meanwhile; ``pending_update`` waits for an update without applying it."""

from __future__ import annotations

import torch
from offload_models import tied_layers

from bubbleless_offload import DeviceWeights, HostStore, HostView
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer


def _double_buffered_store():
    store = HostStore(tied_layers(), pin_memory=False)
    store.double_buffer()
    for hp in store.trainable:  # back weights that differ from the front ones
        hp.spare_working.copy_(hp.param.data + 1.0)
    return store


def test_offload_back_view_uploads_the_back_buffers_and_adds_into_the_spare_accumulators_across_swaps():
    store = _double_buffered_store()
    back, front = HostView.back(store), HostView.front(store)
    weights = DeviceWeights(store, "cpu")
    layers = list(range(store.num_layers))
    job = weights.load(layers, back)
    store.swap_working()  # a hand-off meanwhile: the view still reads and writes what it took
    store.swap_grads()
    uploaded = {id(hp): p for hp, p in job._params.values()}
    for hp in store.trainable:
        assert torch.equal(uploaded[id(hp)].data, back.working_of(hp))
        assert not torch.equal(uploaded[id(hp)].data, front.working_of(hp))
        uploaded[id(hp)].grad = torch.ones_like(uploaded[id(hp)].data)
    weights.store_grads(job)
    weights.release(job)
    for hp in store.trainable:
        assert torch.equal(back.grad_of(hp), torch.ones_like(back.grad_of(hp)))
        assert not front.grad_of(hp).any()
    back.zero_grads()
    assert all(not back.grad_of(hp).any() for hp in store.trainable)


def test_offload_frozen_parameters_are_read_from_the_callers_tensors_under_any_view():
    layers = tied_layers()
    layers[1].linear.weight.requires_grad_(False)  # a LoRA base weight
    store = HostStore(layers, pin_memory=False)
    store.double_buffer()
    frozen = next(hp for hp in store.params if not hp.trainable)
    view = HostView.back(store)
    assert view.working_of(frozen).data_ptr() == frozen.param.data_ptr() and id(frozen) not in view.grads
    job = DeviceWeights(store, "cpu").load([1], view)
    uploaded = {id(hp): p for hp, p in job._params.values()}
    assert torch.equal(uploaded[id(frozen)].data, frozen.param.data)


def test_offload_pending_update_waits_without_applying_and_says_whether_it_wrote_the_back_buffers():
    store = HostStore(tied_layers(), pin_memory=False)
    optimizer = AsyncHostOptimizer(store, name="adamw", lr=1e-2)
    assert optimizer.pending_update() is None
    for hp in store.trainable:
        hp.grad.fill_(0.5)
    front = [hp.param.data.clone() for hp in store.trainable]
    optimizer.step()
    written = optimizer.pending_update()
    assert written is not None and written() is True
    assert optimizer.in_flight  # waited, not applied: the front weights are those before the update
    assert all(torch.equal(hp.param.data, f) for hp, f in zip(store.trainable, front, strict=True))
    assert any(not torch.equal(hp.spare_working, f) for hp, f in zip(store.trainable, front, strict=True))
    optimizer.synchronize()
    assert any(not torch.equal(hp.param.data, f) for hp, f in zip(store.trainable, front, strict=True))
