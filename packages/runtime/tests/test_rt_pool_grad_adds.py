"""With a GPU pool's default, a STORE only queues its gradients' copies and the host adds run on the store's
thread (``HostStore.adds``): gradients still equal the unpipelined model's, a failed step's queued adds land
before its sums are dropped (never after), and overlapped steps hand the optimizer complete sums. On CPU
devices the workers add before going on; here every worker is switched to the thread, which then runs for
real."""

import os
import sys
import threading

import pytest

from bubbleless_runtime._testing import tiny_batch, tiny_model
from bubbleless_schedules import Kind
from bubbleless_schedules.roundrobin_layout import PoolGroups

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool import CUTS, _assert_same, _pool  # noqa: E402
from test_rt_pool_async import DelayedReference, _assert_weights  # noqa: E402
from test_rt_pool_async import _pool as _async_pool  # noqa: E402


def _adding_on_a_thread(pipe) -> list:
    """``pipe`` with every STORE leaving its adds to the store's thread; the list gets each batch's bytes."""
    queued, submit = [], pipe.store.adds.submit

    def counting(work, nbytes):
        queued.append(nbytes)
        submit(work, nbytes)

    pipe.store.adds.submit = counting
    for worker in pipe.workers:
        assert worker.weights.store_waits  # CPU devices add before going on by default
        worker.weights.store_waits = False
    return queued


@pytest.mark.parametrize("cut", ["asymmetric", "default"])
def test_rt_pool_gradients_equal_unpipelined_with_the_adds_on_the_stores_thread(cut):
    model, ref = tiny_model(7), tiny_model(7)
    pipe = _pool(model, CUTS[cut])
    queued = _adding_on_a_thread(pipe)
    inputs, targets = tiny_batch(8)
    loss = pipe.step(inputs, targets)
    stores = sum(action.kind == Kind.STORE for row in pipe.schedule.actions for action in row)
    assert len(queued) == stores > 0 and all(nbytes > 0 for nbytes in queued)
    _assert_same(model, ref, inputs, targets, 4, loss)
    assert pipe.store.adds.in_flight_bytes == 0


def test_rt_pool_a_failed_step_drops_its_queued_adds_only_after_they_land():
    model, ref = tiny_model(7), tiny_model(7)
    pipe = _pool(model, PoolGroups((2, 3), 2, (2, 2, 1)))
    queued = _adding_on_a_thread(pipe)
    gate, handlers, held = threading.Event(), pipe.interpreter.handlers, threading.Lock()
    last_recompute = [a for row in pipe.schedule.actions for a in row if a.kind == Kind.R][-1]

    def store(worker, action, state):
        with held:  # the first STORE holds the adds thread first: what is queued from here stays pending
            if not queued:
                pipe.store.adds.submit(lambda: gate.wait(30), 0)
        return handlers[Kind.STORE](worker, action, state)

    def recompute(worker, action, state):
        if action == last_recompute:  # fails once a job has queued its gradients
            for _ in range(300):
                if any(queued):
                    break
                threading.Event().wait(0.01)
            threading.Timer(0.5, gate.set).start()  # the adds land well after the failure
            raise RuntimeError("recompute exploded on purpose")
        return handlers[Kind.R](worker, action, state)

    pipe.interpreter = pipe.interpreter.with_handler(Kind.STORE, store)
    pipe.interpreter = pipe.interpreter.with_handler(Kind.R, recompute)
    inputs, targets = tiny_batch(8)
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        pipe.step(inputs, targets)
    assert any(queued) and gate.is_set()  # the step waited for the held adds before it returned
    pipe.store.adds.settle()
    assert all(not hp.grad.any() for hp in pipe.store.trainable)  # dropped after they landed, not before
    assert all(w.budget.used == 0 for w in pipe.workers)
    pipe.interpreter = pipe.interpreter.with_handler(Kind.R, handlers[Kind.R]).with_handler(Kind.STORE, handlers[Kind.STORE])
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


def test_rt_pool_overlapped_steps_with_the_adds_on_a_thread_equal_plain_adamw_one_step_late():
    batches = [tiny_batch(8, seed=s) for s in (1, 2, 3, 4)]
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _async_pool(model, asynchronous=True)
    queued = _adding_on_a_thread(pipe)
    assert len(list(pipe.steps(batches))) == 4 and queued
    for batch in batches:
        reference.step(*batch)
    pipe.synchronize()
    _assert_weights(model, reference.masters)


def test_rt_pool_an_overlapped_failure_with_the_adds_on_a_thread_loses_no_handed_off_step():
    batches = [tiny_batch(8, seed=s) for s in (1, 2, 3, 4, 5)]
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _async_pool(model, asynchronous=True)
    _adding_on_a_thread(pipe)
    handlers, poisoned = pipe.interpreter.handlers, batches[2][0]
    last_recompute = [a for row in pipe.schedule.actions for a in row if a.kind == Kind.R][-1]
    gate, stored, held = threading.Event(), [], threading.Lock()

    def of_poisoned(state) -> bool:
        return state.step.inputs[0].data_ptr() == poisoned.data_ptr()

    def store(worker, action, state):
        if of_poisoned(state):
            with held:  # its first STORE holds the adds thread: its adds stay queued until after it failed
                if not stored:
                    pipe.store.adds.submit(lambda: gate.wait(30), 0)
                stored.append(action)
        return handlers[Kind.STORE](worker, action, state)

    def recompute(worker, action, state):
        if of_poisoned(state) and action == last_recompute:
            for _ in range(300):
                if stored:
                    break
                threading.Event().wait(0.01)
            threading.Timer(0.5, gate.set).start()
            raise RuntimeError("recompute exploded on purpose")
        return handlers[Kind.R](worker, action, state)

    pipe.interpreter = pipe.interpreter.with_handler(Kind.STORE, store).with_handler(Kind.R, recompute)
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        list(pipe.steps(batches[:4]))
    assert stored and gate.is_set()
    pipe.interpreter = pipe.interpreter.with_handler(Kind.STORE, handlers[Kind.STORE]).with_handler(Kind.R, handlers[Kind.R])
    list(pipe.steps(batches[4:]))
    for batch in (*batches[:2], batches[4]):
        reference.step(*batch)
    pipe.synchronize()
    _assert_weights(model, reference.masters)
