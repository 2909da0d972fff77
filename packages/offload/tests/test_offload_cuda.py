"""The real accelerator path: pinned host memory, CUDA/ROCm streams and events. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from offload_models import batch, loss_of, reference_grads, tied_layers

from bubbleless_offload import (
    DeviceStreams,
    DeviceWeights,
    HostStore,
    PinnedPool,
    WeightUploads,
    stream_context,
    to_device,
    to_host,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: runs the real streams and pinned memory"
)

ALL = (0, 1, 2, 3)


def test_streams_are_real_cuda_streams_on_an_indexed_device():
    streams = DeviceStreams("cuda")
    assert streams.device.index is not None
    assert all(isinstance(getattr(streams, kind), torch.cuda.Stream) for kind in DeviceStreams.KINDS)
    assert len({id(getattr(streams, kind)) for kind in DeviceStreams.KINDS}) == 4
    event = streams.record(streams.weights_in)
    event.wait(streams.compute)
    event.synchronize()
    assert event.query()


def test_store_pins_working_weights_by_default_and_fp32_masters_stay_aliases():
    store = HostStore(tied_layers())
    assert store.pin_memory and store.pool.pin
    assert all(hp.param.device.type == "cpu" and hp.param.is_pinned() for hp in store.params)
    assert all(hp.master.data_ptr() == hp.param.data_ptr() for hp in store.trainable)


def test_layers_on_the_gpu_are_moved_to_the_host():
    layers = [layer.cuda() for layer in tied_layers()]
    store = HostStore(layers)
    assert all(hp.param.device.type == "cpu" for hp in store.params)
    assert all(b.device.type == "cpu" for layer in layers for b in layer.buffers())


def _two_batches_and_a_gpu_store():
    """Two micro-batches, the gradients a plain backward over them gives, and a store with a GPU's weights."""
    layers = tied_layers()
    batches = [batch(1), batch(2)]
    expected = reference_grads(layers, batches)
    store = HostStore(layers)
    streams = DeviceStreams("cuda")
    weights = DeviceWeights(store, streams.device, streams=streams)
    return batches, expected, store, streams, weights


def test_a_job_on_the_gpu_gives_the_cpu_gradients():
    batches, expected, store, streams, weights = _two_batches_and_a_gpu_store()
    job = weights.load(ALL)
    assert all(p.device == streams.device for module in job.modules for p in module.parameters())
    assert job.modules[0].emb.weight is job.modules[3].proj.weight
    with stream_context(streams.compute):
        job.ready.wait(streams.compute)
        for tokens, targets in batches:
            loss_of(job.modules, tokens.to(streams.device), targets.to(streams.device)).backward()
    weights.store_grads(job).synchronize()
    weights.release(job)
    assert weights.resident_bytes == 0
    for hp in store.trainable:
        torch.testing.assert_close(hp.grad, expected[id(hp.param)], rtol=1e-4, atol=1e-5)


def test_activations_round_trip_through_pinned_host_buffers_on_side_streams():
    streams = DeviceStreams("cuda")
    pool = PinnedPool(pin=True)
    with stream_context(streams.compute):
        produced = torch.randn(512, 512, device=streams.device) * 3
        host, copied = to_host(produced, stream=streams.out, pool=pool)
    copied.synchronize()
    assert host.is_pinned() and torch.equal(host, produced.cpu())
    back, arrived = to_device(host, streams.device, stream=streams.activations_in, used_on=streams.compute)
    arrived.wait(streams.compute)
    with stream_context(streams.compute):
        assert torch.equal(back, produced)
    arrived.synchronize()
    pool.release(host)
    assert pool.bytes_in_use == 0


def test_paced_weight_uploads_let_an_activation_copy_land_while_weights_still_arrive():
    """256 MiB of weights in 8 MiB chunks, two in flight; a 1 MiB activation copy queued meanwhile lands
    while chunks of the weights are still not even issued (they need 5-10 ms at PCIe/NVLink rates)."""
    streams = DeviceStreams("cuda")
    uploads = WeightUploads(streams, chunk_bytes=8 << 20, window=2)
    assert uploads.paced
    host = torch.randn(64 << 20).pin_memory()
    activation = torch.randn(1 << 18).pin_memory()
    device_copy = torch.empty_like(host, device=streams.device)
    upload = uploads.upload([(host, device_copy)])
    with uploads.activation_first():
        _, arrived = to_device(activation, streams.device, stream=streams.activations_in)
    arrived.synchronize()
    assert upload.chunks_left > 0  # paced: the activation did not wait for the whole job's weights
    upload.wait(streams.compute)
    upload.synchronize()
    assert torch.equal(device_copy.cpu(), host)


def test_a_gpu_store_queues_its_adds_on_the_stores_thread_and_they_sum_the_same():
    batches, expected, store, streams, weights = _two_batches_and_a_gpu_store()
    assert not weights.store_waits  # an accelerator leaves the host adds to the store's thread
    for tokens, targets in batches:  # one job per micro-batch: two stores into the same accumulators
        job = weights.load(ALL)
        with stream_context(streams.compute):
            job.ready.wait(streams.compute)
            loss_of(job.modules, tokens.to(streams.device), targets.to(streams.device)).backward()
        weights.store_grads(job)
        weights.release(job)
    store.flush_adds()
    assert store.adds.in_flight_bytes == 0 and store.pool.bytes_in_use == 0  # staging buffers given back
    for hp in store.trainable:
        torch.testing.assert_close(hp.grad, expected[id(hp.param)], rtol=1e-4, atol=1e-5)
