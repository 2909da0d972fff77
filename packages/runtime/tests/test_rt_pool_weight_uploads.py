"""RoundRobinPipeline with paced weight uploads (``weight_uploads``), as a GPU runs them, on CPU devices:
a pump thread per device copies each job's weights in chunks of a few hundred bytes while the workers
compute; the gradients, the overlapped optimizer steps and failure recovery are those of the default."""

import os
import sys

import pytest

from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules.roundrobin_layout import PoolGroups

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool import CALLS, FailOn, _assert_same  # noqa: E402
from test_rt_pool_async import SETTINGS, DelayedReference, _assert_weights  # noqa: E402

PACED = {"paced": True, "chunk_bytes": 256, "window": 1}
CUT = PoolGroups((3, 2), 2, (1, 2, 2))
BATCHES = [tiny_batch(8, seed=s) for s in (1, 2, 3)]


def _pool(model, **kwargs):
    return RoundRobinPipeline(model, devices=["cpu"] * 4, num_microbatches=4, loss_fn=tiny_loss, partition=CUT,
                              timeout=60, weight_uploads=PACED, **kwargs)


def test_rt_pool_paced_uploads_give_the_unpipelined_gradients_and_put_every_activation_first(monkeypatch):
    model, ref = tiny_model(7), tiny_model(7)
    pipe = _pool(model)
    assert all(w.weights.uploads.paced and w.weights.uploads.chunk_bytes == 256 for w in pipe.workers)
    held, uploaded = [], []
    for worker in pipe.workers:
        first = worker.weights.uploads.activation_first
        monkeypatch.setattr(worker.weights.uploads, "activation_first",
                            lambda first=first: held.append(1) or first())  # the real one still runs
        upload = worker._upload
        monkeypatch.setattr(worker, "_upload", lambda *a, upload=upload: uploaded.append(1) or upload(*a))
    inputs, targets = tiny_batch(8)
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)
    assert len(held) == len(uploaded) > 0  # every activation upload (inputs and gradients) goes first
    assert all(w.weights.uploads._activations_open == 0 for w in pipe.workers)


def test_rt_pool_paced_overlapped_steps_equal_plain_adamw_one_step_late():
    model = tiny_model(7)
    reference = DelayedReference(tiny_model(7))
    pipe = _pool(model, optimizer={**SETTINGS, "asynchronous": True})
    losses = list(pipe.steps(BATCHES))
    for batch in BATCHES:
        reference.step(*batch)
    assert len(losses) == len(BATCHES)
    pipe.synchronize()
    _assert_weights(model, reference.masters)


def test_rt_pool_paced_failure_leaves_no_weights_and_the_next_step_works():
    model, ref = tiny_model(6), tiny_model(6)
    model.insert(3, FailOn(fail_at=3))
    ref.insert(3, FailOn(fail_at=0))
    inputs, targets = tiny_batch(8)
    CALLS["count"] = 0  # the failing layer's call counter
    pipe = RoundRobinPipeline(model, devices=["cpu"] * 4, num_microbatches=4, loss_fn=tiny_loss, timeout=60,
                              partition=PoolGroups((2, 3), 2, (2, 2, 1)), weight_uploads=PACED)
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        pipe.step(inputs, targets)
    assert all(w.weights.resident_bytes == 0 and w.budget.used == 0 for w in pipe.workers)
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)


@pytest.mark.parametrize(("options", "match"), [
    ({"chunk": 1}, r"unknown option\(s\) \['chunk'\]; the options are \('paced', 'chunk_bytes', 'window'\)"),
    ({"window": 0}, "window must be at least 1"),
    ("fast", "must be a dict"),
])
def test_rt_pool_bad_weight_upload_options_are_refused_before_planning(options, match):
    with pytest.raises(ValueError, match=match):
        RoundRobinPipeline(tiny_model(4), devices=["cpu"] * 2, num_microbatches=2, loss_fn=tiny_loss,
                           weight_uploads=options)  # partition='auto' without sample_input: checked first
