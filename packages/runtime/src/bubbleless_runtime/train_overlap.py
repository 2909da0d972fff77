"""``Trainer.train_steps`` on the round-robin pool with the one-step-stale optimizer: the optimizer steps of a
stretch of training with consecutive steps overlapped (``RoundRobinPipeline.steps``).

Each ``StepStats`` is what ``Trainer.train_step`` would report for the same step (the same weights, loss,
gradient norm, learning rate and tokens), except ``seconds``: the time since the previous step ended,
so a run's tokens/s counts the drain the overlap hides once. Batches are drawn as the pool needs them,
up to two optimizer steps ahead of the last reported; the stretch ends with the pool idle (the last
step's stats come when every device is done), so evaluate, save or stop after it, never inside it. A
stop signal ends the stretch early: no batch of a further optimizer step is drawn (the first step of a stretch always runs,
as ``train_step`` would), the steps already running end, and the last step's stats carry the signal.
Leaving the stretch early (a ``break``, an error) drops the steps still running and rewinds
``data_position`` to the first batch no reported step used.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator


def overlapped_train_steps(trainer, data, count: int, stop=None) -> Iterator:
    from .trainer import StepStats, real_tokens

    window = trainer.grad_accum
    trainer.loss.factor = trainer.scaler.scale / (trainer.num_microbatches * window)
    tokens: deque[int] = deque()
    drawn = {"all": False}

    def batches():
        for drawn_so_far in range(count * window):
            # a signal stops the drawing between optimizer steps, after the first (as train_step runs one)
            if drawn_so_far and drawn_so_far % window == 0 and stop is not None and stop.signum is not None:
                break
            inputs, targets = data.batch(trainer.data_position)
            trainer.data_position += 1
            tokens.append(real_tokens(inputs))
            yield inputs, targets
        drawn["all"] = True

    with trainer._autocast(trainer.autocast_device or trainer.pipeline.devices[0].type):
        losses = trainer.pipeline.steps(batches(), accumulate=window)  # the autocast is taken here
    start, summed, step_tokens, in_window = time.perf_counter(), 0.0, 0, 0
    try:
        for loss in losses:
            summed, step_tokens, in_window = summed + float(loss), step_tokens + tokens.popleft(), in_window + 1
            if in_window < window:
                continue
            lr = trainer.optimizer.param_groups[0]["lr"]  # what this step's hand-off just stepped with
            grad_norm, skipped = trainer._finish()
            if not skipped and trainer.scheduler is not None:
                trainer.scheduler.step()
            trainer.step += 1
            last = drawn["all"] and not tokens
            mean_loss, signal = trainer._loss_and_stop_everywhere(summed / trainer.scaler_scale_used(),
                                                                  stop if last else None)
            now = time.perf_counter()
            in_window = 0
            yield StepStats(trainer.step, mean_loss, grad_norm, lr, step_tokens, now - start, skipped, signal)
            start, summed, step_tokens = now, 0.0, 0
    finally:
        losses.close()  # the steps still running are dropped (a break, or an error here)
        if tokens or in_window:  # batches drawn for no optimizer step: the next call draws them again
            trainer.data_position -= len(tokens) + in_window
            if in_window:  # a part of a window ran and added into the accumulators: drop it too
                trainer.pipeline.store.zero_grad()
