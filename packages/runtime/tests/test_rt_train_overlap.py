"""``Trainer.train_steps`` on the pool with the one-step-stale optimizer overlaps consecutive steps: the same
stats and weights as ``train_step`` in a loop (and as torch AdamW one step late), a stop signal ends the
stretch between optimizer steps with nothing lost, and the pool is idle when the stretch ends."""

import math
import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_rt_train_async import ACCUM, SETTINGS, Batches, DelayedReference, _error, _trainer  # noqa: E402

from bubbleless_runtime._testing import tiny_model  # noqa: E402


def test_overlapped_train_steps_report_what_train_step_does_on_the_same_weights():
    overlapped, looped, data = tiny_model(7), tiny_model(7), Batches()
    trainer = _trainer(overlapped, {**SETTINGS, "asynchronous": True})
    loop = _trainer(looped, {**SETTINGS, "asynchronous": True})
    reference = DelayedReference(tiny_model(7))
    assert trainer.overlaps
    got = list(trainer.train_steps(data, 5))
    want = [loop.train_step(data) for _ in range(5)]
    for position in range(5):
        reference.step(data, position * ACCUM)
    assert [s.step for s in got] == [1, 2, 3, 4, 5] and trainer.data_position == loop.data_position == 5 * ACCUM
    assert [s.lr for s in got] == [s.lr for s in want]
    assert [s.tokens for s in got] == [s.tokens for s in want]
    assert [s.loss for s in got] == pytest.approx([s.loss for s in want], rel=1e-6)
    assert math.isnan(got[0].grad_norm)
    assert [s.grad_norm for s in got[1:]] == pytest.approx([s.grad_norm for s in want[1:]], rel=1e-6)
    assert all(s.stop_signal is None for s in got)
    assert _error(overlapped, reference.running) <= 1e-5
    trainer.synchronize()
    assert _error(overlapped, reference.masters) <= 1e-5
    trainer.train_step(data)  # the pool is free again: a plain step runs


class _Stop:
    """A StopRequest whose signal arrives once ``after`` batches were drawn."""

    def __init__(self, data, after: int):
        self.data, self.after = data, after

    @property
    def signum(self):
        return signal.SIGTERM if self.data.drawn >= self.after else None

    def votes(self):
        from bubbleless_runtime.signals import STOP_SIGNALS

        return [1.0 if s == self.signum else 0.0 for s in STOP_SIGNALS]


class _Counted(Batches):
    drawn = 0

    def batch(self, index):
        self.drawn += 1
        return super().batch(index)


def test_a_stop_signal_ends_the_stretch_after_a_whole_optimizer_step_and_the_last_stats_carry_it():
    model, data = tiny_model(7), _Counted()
    trainer = _trainer(model, {**SETTINGS, "asynchronous": True})
    reference = DelayedReference(tiny_model(7))
    stop = _Stop(data, after=3)  # arrives in the middle of the second optimizer step's batches
    got = list(trainer.train_steps(data, 6, stop=stop))
    assert [s.step for s in got] == [1, 2]  # the second step's window was completed, no third was drawn
    assert [s.stop_signal for s in got] == [None, signal.SIGTERM]
    assert trainer.data_position == data.drawn == 2 * ACCUM
    for position in range(2):
        reference.step(data, position * ACCUM)
    trainer.synchronize()
    assert _error(model, reference.masters) <= 1e-5  # nothing drawn was lost or half-applied


def test_leaving_a_stretch_early_rewinds_to_the_first_batch_no_reported_step_used():
    model, data = tiny_model(7), Batches()
    trainer = _trainer(model, {**SETTINGS, "asynchronous": True})
    reference = DelayedReference(tiny_model(7))
    stretch = trainer.train_steps(data, 5)
    next(stretch)
    stretch.close()  # the second step's batches were drawn and were running: dropped, drawn again below
    assert trainer.step == 1 and trainer.data_position == ACCUM
    assert [s.step for s in trainer.train_steps(data, 2)] == [2, 3]
    for position in range(3):
        reference.step(data, position * ACCUM)
    trainer.synchronize()
    assert _error(model, reference.masters) <= 1e-5
