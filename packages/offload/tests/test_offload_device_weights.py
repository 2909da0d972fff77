"""DeviceWeights on a CPU "device": real copies, reused shells, exact gradients, budget refusals."""

from __future__ import annotations

import threading

import pytest
import torch
from offload_models import batch, loss_of, reference_grads, tied_layers

from bubbleless_offload import DeviceOutOfMemory, DeviceWeights, HostStore, MemoryBudget

ALL = (0, 1, 2, 3)


def run_job(weights: DeviceWeights, layers, batches):
    """What a worker does for a fused job: load, forward+backward per micro-batch, store, release."""
    job = weights.load(layers)
    job.ready.wait(weights.streams.compute)
    for tokens, targets in batches:
        loss_of(job.modules, tokens, targets).backward()
    weights.store_grads(job).synchronize()
    weights.release(job)
    return job


def test_cpu_load_makes_real_copies_that_compute_what_the_layers_compute():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    weights = DeviceWeights(store, "cpu")
    job = weights.load(ALL)
    assert job.ready.query() and job.layers == ALL and len(job.modules) == 4
    assert job.nbytes == store.weight_bytes(ALL) == weights.resident_bytes == weights.budget.used
    for index, module in enumerate(job.modules):
        assert module is not layers[index]
        shell_params = module.named_parameters(remove_duplicate=False)
        for (name, hp), (shell_name, p) in zip(store.layer_params(index), shell_params, strict=True):
            assert name == shell_name and p.data_ptr() != hp.param.data_ptr() and torch.equal(p, hp.param)
        for (_, host), (_, b) in zip(layers[index].named_buffers(), module.named_buffers(), strict=True):
            assert b.data_ptr() != host.data_ptr() and torch.equal(b, host)
    tokens, targets = batch(0)
    assert torch.equal(loss_of(job.modules, tokens, targets), loss_of(layers, tokens, targets))
    weights.release(job)
    assert weights.resident_bytes == 0 and weights.budget.used == 0
    assert all(p.numel() == 0 for module in job.modules for p in module.parameters())


def test_tied_weight_is_uploaded_once_per_job_and_shared_by_both_shells():
    store = HostStore(tied_layers(), pin_memory=False)
    weights = DeviceWeights(store, "cpu")
    job = weights.load(ALL)
    embedding, head = job.modules[0].emb.weight, job.modules[3].proj.weight
    assert embedding is head  # one device parameter: autograd sums its two uses, one .grad on the device
    assert job.nbytes == store.weight_bytes(ALL) < sum(store.weight_bytes([i]) for i in ALL)
    weights.release(job)
    alone = weights.load((3,))  # in a job without layer 0 the head has its own copy again
    assert alone.modules[0].proj.weight is not embedding and alone.modules[0].proj.weight.numel() > 0
    weights.release(alone)


def test_shells_are_built_once_and_reused_across_jobs():
    weights = DeviceWeights(HostStore(tied_layers(), pin_memory=False), "cpu")
    first = run_job(weights, (1, 2), [])
    second = weights.load((2, 3))
    assert second.modules[0] is first.modules[1]
    weights.release(second)


def test_the_same_layers_load_twice_as_two_jobs_and_a_job_releases_once():
    # a forward and a backward job over the same layers may both be live on one device (prefetch)
    weights = DeviceWeights(HostStore(tied_layers(), pin_memory=False), "cpu")
    job = weights.load((0, 1))
    twin = weights.load((0, 1))
    assert twin.modules[0] is not job.modules[0]
    weights.release(twin)
    weights.release(job)
    with pytest.raises(ValueError, match="released already"):
        weights.release(job)
    with pytest.raises(ValueError, match="not loaded"):
        weights.store_grads(job)
    weights.release(weights.load((0, 1)))
    with pytest.raises(ValueError, match="distinct"):
        weights.load((1, 1))


def test_overlapping_live_jobs_get_their_own_shells_and_gradients():
    """A forward group and a backward group cut differently may both be live on one device (prefetch)."""
    layers = tied_layers()
    expected = reference_grads(layers, [batch(1), batch(2)])
    store = HostStore(layers, pin_memory=False)
    weights = DeviceWeights(store, "cpu")
    current, upcoming = weights.load(ALL), weights.load((1, 2))
    assert current.modules[1] is not upcoming.modules[0]
    assert current.modules[1].linear.weight.data_ptr() != upcoming.modules[0].linear.weight.data_ptr()
    assert weights.resident_bytes == current.nbytes + upcoming.nbytes
    loss_of(current.modules, *batch(1)).backward()
    assert upcoming.modules[0].linear.weight.grad is None
    weights.store_grads(current)
    weights.release(current)
    again = weights.load(ALL)  # the released shells are free again: no third shell is built
    assert again.modules[1] is current.modules[1]
    weights.release(upcoming)
    loss_of(again.modules, *batch(2)).backward()
    weights.store_grads(again)
    weights.release(again)
    for hp in store.trainable:
        assert torch.equal(hp.grad, expected[id(hp.param)]), hp.name


def test_grads_across_two_jobs_equal_two_plain_backward_calls_exactly():
    layers = tied_layers()
    batches = [batch(1), batch(2), batch(3)]
    expected = reference_grads(layers, batches)
    store = HostStore(layers, pin_memory=False)
    weights = DeviceWeights(store, "cpu")
    run_job(weights, ALL, batches[:2])  # two micro-batches accumulate on the device
    run_job(weights, ALL, batches[2:])  # a second job adds on the host
    for hp in store.trainable:
        assert torch.equal(hp.grad, expected[id(hp.param)]), hp.name
        assert hp.param.grad is None  # the caller's grads stay untouched until grads_to_params


def test_store_grads_never_touches_frozen_params():
    layers = tied_layers()
    for p in layers[1].parameters():
        p.requires_grad_(False)
    store = HostStore(layers, pin_memory=False)
    frozen = [hp for _, hp in store.layer_params(1)]
    before = [hp.param.detach().clone() for hp in frozen]
    weights = DeviceWeights(store, "cpu")
    job = weights.load(ALL)
    assert not any(p.requires_grad for p in job.modules[1].parameters())
    loss_of(job.modules, *batch(0)).backward()
    weights.store_grads(job)
    weights.release(job)
    assert all(hp.grad is None and hp.param.grad is None for hp in frozen)
    assert all(torch.equal(hp.param, b) for hp, b in zip(frozen, before, strict=True))
    assert all(hp.grad.any() for hp in store.trainable)


def test_four_devices_storing_at_once_sum_like_serial_backward():
    layers = tied_layers()
    batches = [batch(seed) for seed in range(4)]
    expected = reference_grads(layers, batches)
    store = HostStore(layers, pin_memory=False)
    devices = [DeviceWeights(store, "cpu") for _ in range(4)]
    errors, start = [], threading.Barrier(4)

    def worker(weights, mb):
        try:
            start.wait()
            run_job(weights, ALL, [mb])
        except BaseException as error:  # surfaced below, so a failing thread fails the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=args) for args in zip(devices, batches, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for hp in store.trainable:  # the order of the four additions varies: close, not bit-equal
        torch.testing.assert_close(hp.grad, expected[id(hp.param)], rtol=1e-6, atol=1e-7)


def test_a_budget_too_small_refuses_the_load_and_leaves_the_device_clean():
    store = HostStore(tied_layers(), pin_memory=False)
    need = store.weight_bytes(ALL)
    weights = DeviceWeights(store, "cpu", budget=MemoryBudget(need - 1, "cpu"))
    with pytest.raises(DeviceOutOfMemory) as refused:
        weights.load(ALL)
    message = str(refused.value)
    assert message.startswith("cpu: no room for weights of layers (0, 1, 2, 3)")
    assert f"{need} bytes" in message and f"({need - 1} bytes) budget" in message and "(0 bytes)" in message
    assert (refused.value.requested, refused.value.used, refused.value.limit) == (need, 0, need - 1)
    assert weights.resident_bytes == 0
    weights.release(weights.load(ALL[:3]))  # the refused job is not left marked as loaded


def test_training_flag_follows_the_callers_layers():
    layers = tied_layers()
    weights = DeviceWeights(HostStore(layers, pin_memory=False), "cpu")
    layers[1].eval()
    job = weights.load((1,))
    assert not job.modules[0].training and not job.modules[0].linear.training
    weights.release(job)


def test_streams_for_another_device_type_are_refused():
    from bubbleless_offload import DeviceStreams

    with pytest.raises(ValueError, match="not supported"):
        DeviceWeights(HostStore(tied_layers(), pin_memory=False), "meta", streams=None)
    with pytest.raises(ValueError, match="streams are for cpu"):
        DeviceWeights(HostStore(tied_layers(), pin_memory=False), "meta", streams=DeviceStreams("cpu"))
