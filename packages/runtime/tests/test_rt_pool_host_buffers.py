"""With pinned memory (a GPU pool's default), the pool's activations cross devices through reused host
buffers (``RoundRobinPipeline.host_buffers``, a ``PinnedPool``): each goes back once its last reader's copy
is done, a failed step gives back what it held, and a long run holds no more than a step or two needs.
On CPU devices the pool uses fresh tensors (nothing to pin); here each pipeline is given an unpinned
``PinnedPool`` instead, which runs the same bookkeeping."""

import os
import sys

import pytest

from bubbleless_offload import PinnedPool
from bubbleless_runtime._testing import tiny_batch, tiny_model
from bubbleless_runtime.pool_board import Board
from bubbleless_schedules.roundrobin_layout import PoolGroups

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_pool import CALLS, FailOn, _assert_same, _pool  # noqa: E402
from test_rt_pool_async import _pool as _async_pool  # noqa: E402


def _reusing(pipe):
    """``pipe`` with an unpinned host-buffer pool, as a pinned one is wired on a GPU pool."""
    assert pipe.host_buffers is None  # CPU devices: fresh tensors by default
    pipe.host_buffers = PinnedPool(pin=False)
    for worker in pipe.workers:
        worker.host_buffers = pipe.host_buffers
    return pipe


def test_rt_pool_host_buffers_all_come_back_after_a_step_and_are_reused_by_the_next():
    model, ref = tiny_model(7), tiny_model(7)
    pipe = _reusing(_pool(model, None))
    inputs, targets = tiny_batch(8)
    pipe.step(inputs, targets)
    held = pipe.host_buffers.bytes_reserved
    assert held > 0 and pipe.host_buffers.bytes_in_use == 0
    model.zero_grad()
    loss = pipe.step(inputs, targets)
    _assert_same(model, ref, inputs, targets, 4, loss)  # reused buffers carry this step's activations
    # without reuse the second step would add as much again; which sizes are out at once varies with timing
    assert pipe.host_buffers.bytes_in_use == 0 and held <= pipe.host_buffers.bytes_reserved < 2 * held


def test_rt_pool_a_failed_step_gives_its_host_buffers_back():
    model = tiny_model(6)
    model.insert(3, FailOn(fail_at=3))
    CALLS["count"] = 0
    pipe = _reusing(_pool(model, PoolGroups((2, 3), 2, (2, 2, 1))))
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        pipe.step(*tiny_batch(8))
    assert pipe.host_buffers.bytes_in_use == 0


def test_rt_pool_a_forward_failing_after_it_saved_an_activation_gives_that_buffer_back():
    model = tiny_model(6)
    model.insert(4, FailOn(fail_at=1))  # in forward job 1 (layers 2-4), after the save at layer 4
    CALLS["count"] = 0
    pipe = _reusing(_pool(model, PoolGroups((2, 3), 2, (2, 2, 1))))
    assert 4 in pipe.routes.saves[1]
    with pytest.raises(RuntimeError, match="exploded on purpose"):
        pipe.step(*tiny_batch(8))
    assert pipe.host_buffers.bytes_in_use == 0  # the saved activation never reached the board


def test_rt_pool_overlapped_steps_hold_no_more_host_buffers_than_two_steps_in_flight():
    pipe = _reusing(_async_pool(tiny_model(7), asynchronous=True))
    pipe.step(*tiny_batch(8))
    one_step = pipe.host_buffers.bytes_reserved
    losses = list(pipe.steps([tiny_batch(8, seed=s) for s in range(12)]))
    assert len(losses) == 12 and pipe.host_buffers.bytes_in_use == 0
    assert pipe.host_buffers.bytes_reserved <= 2 * one_step  # without reuse: about 12 steps' worth


def test_board_gives_a_payload_back_once_after_its_last_reader_with_every_readers_copy():
    released = []
    board = Board(5.0, {"a": 2, "b": 1}, release=lambda payload, copied: released.append((payload, copied)))
    board.put("a", "A")
    board.put("b", "B")
    board.put("c", "C")  # a payload no reader was counted for
    board.read_done("a", "copy 1")
    assert released == []
    board.read_done("a", "copy 2")
    assert released == [("A", ("copy 1", "copy 2"))]
    board.close()  # what is left: b (never read) and c
    assert sorted(released[1:]) == [("B", ()), ("C", ())]
    board.close()
    assert len(released) == 3  # once each
