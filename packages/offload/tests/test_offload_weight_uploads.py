"""WeightUploads on CPU: chunk plans, the pump thread's real copies, activation priority, cancel, errors.

The copies are real (a pump thread copies host tensors chunk by chunk); what only a GPU shows, a new
activation copy overtaking the weight chunks still queued, is ``test_offload_cuda``'s. Here the order is
observed through the device-stream interface the engine drives: a stream whose events hold the pump at
a gate, and an activation event that records, when the engine makes the weights stream wait for it,
which chunks had already been copied.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from offload_models import batch, reference_grads, tied_layers
from test_offload_device_weights import ALL, run_job

from bubbleless_offload import CpuEvent, CpuStream, DeviceStreams, DeviceWeights, HostStore, WeightUploads
from bubbleless_offload.weight_uploads import plan_chunks


def pairs(*shapes, dtype=torch.float32):
    """(host source with distinct values, zeroed destination) per shape."""
    out = []
    for i, shape in enumerate(shapes):
        source = torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape) + 1000 * i + 1
        out.append((source, torch.zeros_like(source)))
    return out


def chunk_bytes_of(chunk) -> int:
    return sum(s.numel() * s.element_size() for s, _ in chunk)


def test_plan_slices_a_large_tensor_groups_small_ones_and_covers_every_element_once():
    copies = pairs((10,), (3,), (100,), (2,), (2,))  # 40, 12, 400, 8, 8 bytes of fp32
    chunks = plan_chunks(copies, 64)
    assert [chunk_bytes_of(c) for c in chunks] == [52, 64, 64, 64, 64, 64, 64, 16, 16]
    assert all(chunk_bytes_of(c) <= 64 for c in chunks)
    for chunk in chunks:
        for source, destination in chunk:
            assert destination.sum() == 0  # every element once: a second write would not be caught by equality
            destination.copy_(source)
    assert all(torch.equal(s, d) for s, d in copies)


def test_plan_keeps_a_large_non_contiguous_tensor_whole_and_refuses_mismatched_shapes():
    source = torch.arange(64.0).reshape(8, 8).t()
    chunks = plan_chunks([(source, torch.zeros(8, 8))], 16)
    assert len(chunks) == 1 and chunks[0][0][0] is source
    with pytest.raises(ValueError, match="differ"):
        plan_chunks([(torch.zeros(3), torch.zeros(4))], 16)
    with pytest.raises(ValueError, match="chunk_bytes"):
        plan_chunks([], 0)


@pytest.mark.parametrize(("options", "match"), [
    ({"chunk_bytes": 0}, "chunk_bytes must be a positive"),
    ({"chunk_bytes": 1.5}, "chunk_bytes must be a positive"),
    ({"window": 0}, "window must be at least 1"),
    ({"paced": "yes"}, "paced must be True, False or None"),
])
def test_bad_settings_are_refused_with_what_to_pass(options, match):
    with pytest.raises(ValueError, match=match):
        WeightUploads(DeviceStreams("cpu"), **options)


def test_cpu_default_issues_at_once_on_the_calling_thread():
    uploads = WeightUploads(DeviceStreams("cpu"))
    copies = pairs((1000,), (5, 7))
    upload = uploads.upload(copies)
    assert not uploads.paced and upload.query() and upload.chunks_left == 0
    assert all(torch.equal(s, d) for s, d in copies)
    assert uploads._pump is None  # no thread was started


def test_paced_uploads_copy_everything_on_a_pump_thread_that_ends_when_the_queue_is_empty():
    uploads = WeightUploads(DeviceStreams("cpu"), paced=True, chunk_bytes=256, window=1)
    first, second = pairs((1000,), (7, 9), dtype=torch.bfloat16), pairs((300,), (1,))
    a, b = uploads.upload(first), uploads.upload(second)
    b.wait(uploads.streams.compute)  # issued in order: the second upload is done after the first
    assert a.query() and b.query()
    assert all(torch.equal(s, d) for s, d in first + second)
    pump = uploads._pump
    if pump is not None:
        pump.join(5)
    assert uploads.queued == 0 and uploads._pump is None


class GatedStream(CpuStream):
    """weights_in whose chunk events, while ``gate`` is closed, hold the pump in its window wait."""

    def __init__(self) -> None:
        super().__init__("weights_in")
        self.gate = threading.Event()
        self.waiting = threading.Event()  # the pump is blocked at the gate
        self.passed = threading.Event()  # the pump went through the gate

    def record_event(self):
        stream = self

        class Held(CpuEvent):
            def synchronize(self) -> None:
                stream.waiting.set()
                assert stream.gate.wait(10), "the test never opened the gate"
                stream.passed.set()

        return Held()


class ActivationStream(CpuStream):
    """activations_in whose events record, when the weights stream is made to wait for them, how many
    elements of ``watched`` (a weight destination) had been copied by then."""

    def __init__(self, watched: torch.Tensor) -> None:
        super().__init__("activations_in")
        self.seen: list[tuple[str, int]] = []
        self.watched = watched

    def record_event(self):
        stream = self

        class Landed(CpuEvent):
            def wait(self, other=None) -> None:
                stream.seen.append((other.name, int((stream.watched != 0).sum())))

        return Landed()


def gated_uploads(watched=None, **options) -> WeightUploads:
    streams = DeviceStreams("cpu")
    streams.weights_in = GatedStream()
    if watched is not None:
        streams.activations_in = ActivationStream(watched)
    return WeightUploads(streams, paced=True, **options)


def test_an_activation_goes_before_the_weight_chunks_not_yet_issued():
    copies = pairs((40,))  # 160 bytes: four chunks of 10 elements
    uploads = gated_uploads(copies[0][1], chunk_bytes=40, window=1)
    upload = uploads.upload(copies)
    assert uploads.streams.weights_in.waiting.wait(5)  # chunk 1 copied, the pump holds chunk 2
    with uploads.activation_first():
        pass  # the caller's activation copies, queued on activations_in
    assert not upload.query() and upload.chunks_left == 2
    uploads.streams.weights_in.gate.set()
    upload.wait()
    assert uploads.streams.activations_in.seen == [("weights_in", 10)]  # after chunk 1, before chunk 2
    assert torch.equal(*copies[0])


def test_no_weight_chunk_is_issued_while_an_activation_is_being_queued():
    copies = pairs((40,))
    uploads = gated_uploads(copies[0][1], chunk_bytes=40, window=1)
    upload = uploads.upload(copies)
    weights_in = uploads.streams.weights_in
    assert weights_in.waiting.wait(5)
    with uploads.activation_first():  # a blocking copy from pageable memory takes this long, say
        weights_in.gate.set()
        assert weights_in.passed.wait(5)  # the window has room again, yet chunk 2 must wait
        time.sleep(0.2)
        assert int((copies[0][1] != 0).sum()) == 10
    upload.wait()
    assert torch.equal(*copies[0])


def test_an_activation_queued_while_nothing_waits_is_not_kept():
    copies = pairs((64,))
    uploads = WeightUploads(DeviceStreams("cpu"), paced=True, chunk_bytes=64)
    uploads.streams.activations_in = ActivationStream(copies[0][1])
    with uploads.activation_first():
        pass
    uploads.upload(copies).wait()
    assert uploads.streams.activations_in.seen == []


def test_the_window_counts_the_chunks_a_finished_pump_left_in_flight():
    uploads = gated_uploads(chunk_bytes=40, window=1)
    first = pairs((10,))
    uploads.upload(first).wait()  # issued; its pump thread ends with that chunk still in flight
    while uploads._pump is not None:
        time.sleep(0.01)
    second = pairs((20,))
    later = uploads.upload(second)  # a new pump: it must wait for the first chunk before issuing
    assert uploads.streams.weights_in.waiting.wait(5)
    assert int((second[0][1] != 0).sum()) == 0 and later.chunks_left == 1
    uploads.streams.weights_in.gate.set()
    later.wait()
    assert torch.equal(*second[0])


def test_cancel_drops_every_chunk_not_issued_and_the_next_upload_still_arrives():
    uploads = gated_uploads(chunk_bytes=40, window=1)
    first, second = pairs((40,)), pairs((12,))
    a, b = uploads.upload(first), uploads.upload(second)
    assert uploads.streams.weights_in.waiting.wait(5)
    a.cancel()  # chunk 2, in the pump's hands, is dropped as well as chunks 3 and 4
    uploads.streams.weights_in.gate.set()
    b.wait()
    assert torch.equal(*second[0])
    assert int((first[0][1] != 0).sum()) == 10
    with pytest.raises(ValueError, match="cancelled"):
        a.wait()
    assert not a.query()


def test_a_pump_that_cannot_start_fails_the_queued_uploads_and_the_next_one_starts(monkeypatch):
    uploads = WeightUploads(DeviceStreams("cpu"), paced=True, chunk_bytes=64)

    def refuse(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            uploads.upload(pairs((64,)))
    assert uploads.queued == 0 and uploads._pump is None
    copies = pairs((64,))
    uploads.upload(copies).wait()
    assert torch.equal(*copies[0])


def test_a_chunk_failing_after_its_upload_was_handed_out_is_raised_by_that_upload():
    streams = DeviceStreams("cpu")
    failures = iter([RuntimeError("copy engine fault")])

    class Faulty(CpuStream):
        def record_event(self):
            error = next(failures, None)

            class Event(CpuEvent):
                def synchronize(self) -> None:
                    if error is not None:
                        raise error

            return Event()

    streams.weights_in = Faulty("weights_in")
    uploads = WeightUploads(streams, paced=True, chunk_bytes=40, window=1)
    first = uploads.upload(pairs((10,)))
    first.wait()  # issued and handed out; its event fails only when the window next waits on it
    copies = pairs((20,))
    uploads.upload(copies).wait()
    assert torch.equal(*copies[0])  # the later upload is not blamed
    with pytest.raises(RuntimeError, match="copy engine fault"):
        first.wait()
    assert not first.query()


def test_a_failing_copy_reaches_its_waiter_and_later_uploads_still_run():
    uploads = WeightUploads(DeviceStreams("cpu"), paced=True, chunk_bytes=64)
    bad = uploads.upload([(torch.empty(4, device="meta"), torch.zeros(4))])
    good = pairs((50,))
    after = uploads.upload(good)
    with pytest.raises(RuntimeError, match="uploading 16 bytes of weights failed") as caught:
        bad.wait()
    assert caught.value.__cause__ is not None
    after.wait()
    assert torch.equal(*good[0])


def test_paced_jobs_give_the_gradients_of_serial_backward():
    layers = tied_layers()
    batches = [batch(1), batch(2)]
    expected = reference_grads(layers, batches)
    store = HostStore(layers, pin_memory=False)
    streams = DeviceStreams("cpu")
    weights = DeviceWeights(store, "cpu", streams=streams,
                            uploads=WeightUploads(streams, paced=True, chunk_bytes=100, window=1))
    run_job(weights, ALL, batches[:1])  # the second job loads shells the first one filled
    run_job(weights, ALL, batches[1:])
    assert store.trainable
    for hp in store.trainable:
        assert torch.equal(hp.grad, expected[id(hp.param)]), hp.name


def test_releasing_a_job_before_its_weights_arrive_cancels_them_and_frees_its_bytes():
    store = HostStore(tied_layers(), pin_memory=False)
    streams = DeviceStreams("cpu")
    uploads = WeightUploads(streams, paced=True, chunk_bytes=16, window=1)
    streams.weights_in = GatedStream()
    weights = DeviceWeights(store, "cpu", streams=streams, uploads=uploads)
    job = weights.load(ALL)
    assert streams.weights_in.waiting.wait(5)
    assert job.ready.chunks_left > 0 and weights.budget.used == job.nbytes
    weights.release(job)
    assert job.ready.chunks_left == 0 and weights.budget.used == 0
    streams.weights_in.gate.set()
    with pytest.raises(ValueError, match="cancelled"):
        job.ready.wait()
    again = weights.load(ALL)
    again.ready.wait(streams.compute)
    assert weights.budget.used == again.nbytes
    weights.release(again)


def test_uploads_for_other_streams_are_refused():
    store = HostStore(tied_layers(), pin_memory=False)
    with pytest.raises(ValueError, match="other streams"):
        DeviceWeights(store, "cpu", streams=DeviceStreams("cpu"), uploads=WeightUploads(DeviceStreams("cpu")))
