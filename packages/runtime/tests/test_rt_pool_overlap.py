"""RoundRobinPipeline.steps(): consecutive steps overlapped over the one-step-stale optimizer. The weights
equal plain torch AdamW applying each step's gradients one step late (and step() in a loop); step k + 1
really starts before step k ends; failures, early exits and bad calls lose nothing and say what to do."""

import os
import sys
import threading

import pytest
import torch

from bubbleless_runtime._testing import relative_error, tiny_batch, tiny_model
from bubbleless_runtime.pool_overlap import deal_order
from bubbleless_schedules import Kind, generate

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool_async import CUT, DelayedReference, _assert_weights, _pool  # noqa: E402

BATCHES = [tiny_batch(8, seed=s) for s in (1, 2, 3, 4, 5)]


def test_rt_pool_overlapped_steps_equal_plain_adamw_one_step_late_and_step_in_a_loop():
    model, looped = tiny_model(7), tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe, loop = _pool(model, asynchronous=True), _pool(looped, asynchronous=True)
    losses = list(pipe.steps(BATCHES))
    want = [loop.step(*batch) for batch in BATCHES]
    for batch in BATCHES:
        reference.step(*batch)
    assert len(losses) == len(BATCHES)
    assert max(relative_error(a, b) for a, b in zip(losses, want, strict=True)) <= 1e-6
    _assert_weights(model, reference.running)  # what a sixth step would run on
    pipe.synchronize()
    loop.synchronize()
    _assert_weights(model, reference.masters)
    _assert_weights(model, looped, tolerance=1e-6)
    # the pipeline runs plain steps afterwards, on its own rows again
    assert all(w.actions == tuple(pipe.schedule.actions[w.index]) for w in pipe.workers)
    pipe.step(*BATCHES[0])


def test_rt_pool_overlapped_accumulation_equals_steps_without_an_optimizer_step():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=True)
    losses = list(pipe.steps(BATCHES[:4], accumulate=2))
    for position, batch in enumerate(BATCHES[:4]):
        reference.step(*batch, apply=position % 2 == 1)
    assert len(losses) == 4
    pipe.synchronize()
    _assert_weights(model, reference.masters)


def _pinned_store_of_last_row(pipe):
    """The last action of the row that ends last in the predicted timeline."""
    last = max(pipe.predicted_timeline().spans, key=lambda span: span.end)
    return pipe.schedule.actions[last.worker][-1]


def test_rt_pool_step_k_plus_1_starts_on_a_free_device_before_step_k_ends():
    """Step 0's very last action waits until step 1 has run a forward: a pool that started step 1 only after
    step 0 ended would never get there (the wait times out and the test fails)."""
    model = tiny_model(7)
    pipe = _pool(model, asynchronous=True)
    held, started = _pinned_store_of_last_row(pipe), threading.Event()
    first_inputs = BATCHES[0][0]
    handlers = pipe.interpreter.handlers

    def forward(worker, action, state):
        if state.step.inputs[0].data_ptr() != first_inputs.data_ptr():
            started.set()
        return handlers[Kind.F](worker, action, state)

    def last(worker, action, state):
        if action == held and state.step.inputs[0].data_ptr() == first_inputs.data_ptr():
            assert started.wait(30), "step 1 did not start while step 0 drained"
        return handlers[held.kind](worker, action, state)

    pipe.interpreter = pipe.interpreter.with_handler(Kind.F, forward).with_handler(held.kind, last)
    list(pipe.steps(BATCHES[:2]))
    trace = pipe.last_steps_trace
    step0_end = max(s.end for s in trace if s.step == 0)
    step1_start = min(s.start for s in trace if s.step == 1)
    assert step1_start < step0_end
    assert {s.row for s in trace if s.step == 1} == set(range(len(pipe.workers)))
    assert pipe.last_timeline is not None and len(pipe.last_timeline.spans) == sum(map(len, pipe.schedule.actions))


def test_rt_pool_deal_order_is_the_order_one_iteration_starts_its_rows():
    import dataclasses

    schedule = generate("roundrobin", num_ranks=4, num_microbatches=4, forward_stages=3, backward_stages=5)
    assert deal_order(schedule, None) == (0, 1, 2, 3)  # the wavefront starts row r after r forward jobs
    rows = schedule.actions
    swapped = dataclasses.replace(schedule, actions=(rows[2], rows[1], rows[0], rows[3]))
    assert deal_order(swapped, None) == (2, 1, 0, 3)  # the same rows placed elsewhere: dealt by their starts


def test_rt_pool_overlapped_failure_raises_drops_only_the_steps_from_it_on_and_training_goes_on():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=True)
    handlers, poisoned = pipe.interpreter.handlers, BATCHES[2][0]

    def forward(worker, action, state):
        if state.step.inputs[0].data_ptr() == poisoned.data_ptr() and action.microbatch == 1:
            raise RuntimeError("forward exploded on purpose")
        return handlers[Kind.F](worker, action, state)

    pipe.interpreter = pipe.interpreter.with_handler(Kind.F, forward)
    got = []
    with pytest.raises(RuntimeError, match="exploded on purpose") as caught:
        for loss in pipe.steps(BATCHES[:4]):
            got.append(loss)
    notes = " ".join(caught.value.__notes__)
    assert "in step 2 of the overlapped run" in notes and "steps [2, 3] were abandoned" in notes
    assert len(got) == 2  # step 1 ran on to its end while step 2 failed beside it, and was handed off
    for batch in BATCHES[:2]:
        reference.step(*batch)
    assert all(not w.loaded and not w.graphs and not w.reserved for w in pipe.workers)
    assert all(w.budget.used == 0 for w in pipe.workers)
    pipe.interpreter = pipe.interpreter.with_handler(Kind.F, handlers[Kind.F])
    list(pipe.steps(BATCHES[4:]))
    reference.step(*BATCHES[4])
    pipe.synchronize()
    _assert_weights(model, reference.masters)


def test_rt_pool_overlapped_break_abandons_the_running_step_and_keeps_the_ones_yielded():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, asynchronous=True)
    steps = pipe.steps(BATCHES)
    next(steps)
    steps.close()  # what a break out of the loop does: step 1 (and 2) were launched, they are dropped
    reference.step(*BATCHES[0])
    assert all(not hp.grad.any() for hp in pipe.store.trainable)
    pipe.synchronize()
    _assert_weights(model, reference.masters)


@pytest.mark.parametrize("optimizer, accumulate, message", [
    (None, 1, r"one-step-stale optimizer.*'asynchronous': True"),
    ({}, 1, r"one-step-stale optimizer.*'asynchronous': True"),
    ({"asynchronous": True}, 0, "accumulate is the number of steps per optimizer step"),
])
def test_rt_pool_steps_refuses_what_cannot_overlap(optimizer, accumulate, message):
    from bubbleless_runtime._testing import tiny_loss
    from bubbleless_runtime.pool import RoundRobinPipeline

    options = None if optimizer is None else {"name": "adamw", "lr": 1e-3, **optimizer}
    pipe = RoundRobinPipeline(tiny_model(7), devices=["cpu"] * 4, num_microbatches=4, loss_fn=tiny_loss,
                              partition=CUT, optimizer=options, timeout=60)
    with pytest.raises(ValueError, match=message):
        pipe.steps(BATCHES, accumulate=accumulate)


def test_rt_pool_steps_names_a_batch_that_is_not_a_pair():
    pipe = _pool(tiny_model(7), asynchronous=True)
    with pytest.raises(ValueError, match=r"\(inputs, targets\) pairs; item 1 is Tensor"):
        list(pipe.steps([BATCHES[0], BATCHES[1][0]]))
    assert all(not hp.grad.any() for hp in pipe.store.trainable)
    assert len(list(pipe.steps(BATCHES[:2]))) == 2


def test_rt_pool_when_the_last_loss_is_yielded_the_pipeline_is_free_for_step():
    model, looped = tiny_model(7), tiny_model(7)
    pipe, loop = _pool(model, asynchronous=True), _pool(looped, asynchronous=True)
    steps = pipe.steps(BATCHES[:2])
    got = [next(steps), next(steps)]
    got.append(pipe.step(*BATCHES[2]))  # an evaluation or a plain step before the iterator is exhausted
    assert next(steps, None) is None
    want = [loop.step(*batch) for batch in BATCHES[:3]]
    assert max(relative_error(a, b) for a, b in zip(got, want, strict=True)) <= 1e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: uploads from pinned views, real streams")
def test_rt_pool_overlapped_steps_on_a_gpu_equal_the_delayed_reference():
    from test_rt_pool_async import SETTINGS

    from bubbleless_runtime._testing import tiny_loss
    from bubbleless_runtime.pool import RoundRobinPipeline

    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = RoundRobinPipeline(model, devices=["cuda:0"] * 2, num_microbatches=4, loss_fn=tiny_loss,
                              partition=CUT, optimizer={**SETTINGS, "asynchronous": True}, timeout=120)
    assert len(list(pipe.steps(BATCHES))) == len(BATCHES)
    for batch in BATCHES:
        reference.step(*batch)
    _assert_weights(model, reference.running, tolerance=1e-4)  # GPU matmuls round differently
    pipe.synchronize()
    _assert_weights(model, reference.masters, tolerance=1e-4)


def test_rt_pool_a_long_run_keeps_the_views_of_the_last_steps_only(monkeypatch):
    import gc
    import weakref

    from bubbleless_runtime import pool_overlap

    created = []

    class Counted(pool_overlap._ViewOnce):  # weak references: gc.get_objects() while devices build tuples
        def __init__(self, resolve):  # in their threads breaks CPython's tuple resizing (SystemError)
            super().__init__(resolve)
            created.append(weakref.ref(self))

    monkeypatch.setattr(pool_overlap, "_ViewOnce", Counted)
    pipe = _pool(tiny_model(7), asynchronous=True)
    steps = pipe.steps(BATCHES * 6)
    for _ in range(len(BATCHES) * 6 - 1):
        next(steps)
    gc.collect()
    assert len(created) >= len(BATCHES) * 6 - 1
    assert sum(ref() is not None for ref in created) <= 3  # was one per step of the run
    assert len(list(steps)) == 1


def test_rt_pool_a_bad_batch_is_raised_after_the_steps_drawn_before_it_are_yielded():
    model, looped_model = tiny_model(7), tiny_model(7)
    looped, pipe = _pool(looped_model, asynchronous=True), _pool(model, asynchronous=True)
    bad = (BATCHES[3][0][:3], BATCHES[3][1][:3])  # 3 rows cannot make 4 micro-batches
    got = []
    with pytest.raises(ValueError, match="micro-batch"):
        for loss in pipe.steps([*BATCHES[:3], bad]):
            got.append(loss)
    want = [looped.step(*batch) for batch in BATCHES[:3]]
    assert len(got) == 3 and max(relative_error(a, b) for a, b in zip(got, want, strict=True)) <= 1e-6
    pipe.synchronize()
    looped.synchronize()
    _assert_weights(model, looped_model, tolerance=1e-6)


def test_rt_pool_steps_over_no_batches_leaves_no_thread_behind():
    pipe = _pool(tiny_model(7), asynchronous=True)
    before = set(threading.enumerate())  # the threads themselves: a leftover of an earlier test has the same name
    for _ in range(3):
        assert list(pipe.steps([])) == []
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("bubbleless")] == []


def test_rt_pool_accumulation_over_an_odd_count_equals_step_without_an_optimizer_step():
    model, looped_model = tiny_model(7), tiny_model(7)
    pipe, looped = _pool(model, asynchronous=True), _pool(looped_model, asynchronous=True)
    batches = [*BATCHES, *BATCHES[:2]]
    got = list(pipe.steps(batches, accumulate=3))
    want = [looped.step(*batch, optimizer_step=(i + 1) % 3 == 0) for i, batch in enumerate(batches)]
    assert max(relative_error(a, b) for a, b in zip(got, want, strict=True)) <= 1e-6
    for a, b in zip(pipe.store.trainable, looped.store.trainable, strict=True):  # the open window's sums
        assert relative_error(a.grad, b.grad) <= 1e-6
    pipe.synchronize()
    looped.synchronize()
    _assert_weights(model, looped_model, tolerance=1e-6)
