"""GradientAdds and the stores' queued adds: first in first out, bounded, errors raised by the next flush,
and every reader of the accumulators waiting for what was queued before it (CPU: the thread runs for real;
a gate held by the test keeps the queue from draining where a test needs it pending)."""

from __future__ import annotations

import threading

import pytest
import torch
from offload_models import batch, loss_of, reference_grads, tied_layers

from bubbleless_offload import DeviceWeights, GradientAdds, HostStore

ALL = (0, 1, 2, 3)


def _gated(adds: GradientAdds) -> threading.Event:
    """Hold ``adds``' thread until the returned event is set (a batch of 0 bytes queued first)."""
    gate = threading.Event()
    adds.submit(lambda: gate.wait(30), 0)
    return gate


def _in_thread(fn) -> tuple[threading.Thread, threading.Event]:
    returned = threading.Event()

    def body():
        fn()
        returned.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, returned


def test_adds_run_in_queue_order_and_flush_waits_for_all_of_them():
    adds, ran = GradientAdds(), []
    gate = _gated(adds)
    for n in range(5):
        adds.submit(lambda n=n: ran.append(n), 10)
    assert adds.in_flight_bytes == 50
    thread, flushed = _in_thread(adds.flush)
    assert not flushed.wait(0.2) and ran == []  # the gate holds the queue: flush is still waiting
    gate.set()
    thread.join(10)
    assert flushed.is_set() and ran == [0, 1, 2, 3, 4] and adds.in_flight_bytes == 0


def test_a_failed_batch_is_raised_by_the_next_flush_after_the_later_ones_ran():
    adds, ran = GradientAdds(), []

    def fail():
        raise RuntimeError("copy failed on purpose")

    adds.submit(fail, 1)
    adds.submit(lambda: ran.append("after"), 1)
    adds.submit(lambda: (_ for _ in ()).throw(ValueError("second")), 1)
    with pytest.raises(RuntimeError, match="copy failed on purpose") as caught:
        adds.flush()
    assert ran == ["after"] and adds.in_flight_bytes == 0
    assert any("1 later gradient batch(es) failed too" in note for note in caught.value.__notes__)
    adds.flush()  # reported once
    adds.submit(fail, 1)
    errors = adds.settle()  # waits the same way and hands the errors back instead
    assert [str(e) for e in errors] == ["copy failed on purpose"]
    adds.flush()


def test_an_interrupted_wait_leaves_the_batches_not_yet_waited_for_to_the_next_one():
    adds, ran = GradientAdds(), []
    gate = _gated(adds)
    adds.submit(lambda: ran.append("late"), 1)
    futures = list(adds._futures)
    interrupted = futures[0].exception

    def interrupt(timeout=None):  # Ctrl-C while the first batch is waited for
        futures[0].exception = interrupted
        raise KeyboardInterrupt

    futures[0].exception = interrupt
    with pytest.raises(KeyboardInterrupt):
        adds.settle()
    thread, settled = _in_thread(adds.settle)  # still waits for both: neither was forgotten
    assert not settled.wait(0.2) and ran == []
    gate.set()
    thread.join(10)
    assert settled.is_set() and ran == ["late"] and adds._futures == []


def test_a_caller_blocks_while_its_batch_would_pass_the_limit_but_a_batch_alone_always_goes():
    adds = GradientAdds(limit_bytes=100)
    gate = _gated(adds)
    adds.submit(lambda: None, 60)
    thread, queued = _in_thread(lambda: adds.submit(lambda: None, 60))
    assert not queued.wait(0.2) and adds.in_flight_bytes == 60  # 120 would be in flight: it waits
    gate.set()
    thread.join(10)
    assert queued.is_set()
    adds.flush()
    adds.submit(lambda: None, 1000)  # larger than the limit, nothing in flight: it goes
    adds.flush()
    assert adds.in_flight_bytes == 0
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            GradientAdds(limit_bytes=bad)


def _grads_of(layers, seed: int) -> list[torch.Tensor]:
    for layer in layers:
        layer.zero_grad()
    tokens, targets = batch(seed)
    loss_of(layers, tokens, targets).backward()
    return [p.grad.clone() for p in dict.fromkeys(p for layer in layers for p in layer.parameters())]


def test_a_store_reader_waits_for_the_adds_queued_before_it():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    first, second = _grads_of(tied_layers(), 0), _grads_of(tied_layers(), 1)
    gate = _gated(store.adds)
    store.accumulate_all([(hp, g, None) for hp, g in zip(store.trainable, first, strict=True)], wait=False)
    store.accumulate_all([(hp, g, None) for hp, g in zip(store.trainable, second, strict=True)], wait=False)
    assert all(not hp.grad.any() for hp in store.trainable)  # queued behind the gate, not added
    read: list = []
    thread, returned = _in_thread(lambda: read.extend(g.grad.clone() for g in store.masters_with_grads()))
    assert not returned.wait(0.2)
    gate.set()
    thread.join(10)
    for got, a, b in zip(read, first, second, strict=True):
        torch.testing.assert_close(got, a + b)


def test_zero_grad_lets_queued_adds_land_first_and_drops_their_errors():
    store = HostStore(tied_layers(), pin_memory=False)
    grads = _grads_of(tied_layers(), 0)
    gate = _gated(store.adds)
    store.accumulate_all([(hp, g, None) for hp, g in zip(store.trainable, grads, strict=True)], wait=False)
    store.adds.submit(lambda: (_ for _ in ()).throw(RuntimeError("a failed step's copy")), 0)
    thread, zeroed = _in_thread(store.zero_grad)
    assert not zeroed.wait(0.2)
    gate.set()
    thread.join(10)
    assert zeroed.is_set() and all(not hp.grad.any() for hp in store.trainable)  # nothing landed after
    store.flush_adds()  # the dropped sums' error went with them


def test_store_grads_without_waiting_returns_before_the_adds_and_sums_the_same():
    layers, batches = tied_layers(), [batch(seed) for seed in range(3)]
    want = reference_grads(layers, batches)
    waited, queued = HostStore(layers, pin_memory=False), HostStore(tied_layers(), pin_memory=False)
    gate = _gated(queued.adds)
    for store, wait in ((waited, True), (queued, False)):
        weights = DeviceWeights(store, "cpu")
        assert weights.store_waits  # a CPU device adds before returning unless asked not to
        for tokens, targets in batches:
            job = weights.load(ALL)
            loss_of(job.modules, tokens, targets).backward()
            weights.store_grads(job, wait=wait)
            weights.release(job)
    assert all(not hp.grad.any() for hp in queued.trainable) and queued.adds.in_flight_bytes > 0
    gate.set()
    queued.flush_adds()
    for a, b in zip(waited.trainable, queued.trainable, strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
        torch.testing.assert_close(b.grad, want[id(a.param)].float())
