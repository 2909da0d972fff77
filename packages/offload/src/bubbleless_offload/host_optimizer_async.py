"""``AsyncHostOptimizer``: the host optimizer one step stale, on a thread, overlapping the next step.

RoundPipe's default consistency (its paper, "Consistency"): the next iteration runs on the previous
update's weights while the CPU optimizer works. Here, with ``w_k`` the weights optimizer step k produced:

    step k computes g_k = grad at w_{k-1};  meanwhile the thread makes w_k = w_{k-1} - update(g_{k-1})

so ``w_{k+1} = w_k - update(g(w_{k-1}))``: each update applies gradients taken one update earlier.

What one ``step()`` does (call it when every gradient of the step is down and no device runs):

1. ``synchronize()``: wait for the update handed off by the previous ``step()`` (it ran while this step
   computed), raise its exception if it had one, and swap the back working buffers it wrote in front
   (``HostStore.swap_working``: a pointer swap per parameter, no copy on the caller's path).
2. Swap the gradient accumulators (``HostStore.swap_grads``): the next step adds into the other set.
3. Start the thread on the spent set: unscale/skip on inf-nan/clip/step the fp32 masters exactly as
   ``HostOptimizer.update`` does, write the masters into the back working buffers, zero the spent set.

Host memory: ``HostStore.double_buffer`` adds, per trainable parameter, a second fp32 accumulator and a
second working buffer (6 bytes for bf16 working weights, 12 for fp32 ones, which also need a master of
their own): 24 bytes per parameter in all for bf16 mixed precision with Adam, against 18 synchronous.

Hyper-parameters: each update uses the ``param_groups`` values (an LR scheduler's ``lr``) in force when
``step()`` hands it off, as the synchronous ``step()`` would: ``torch_optimizer`` is what callers and
schedulers see; the thread steps a twin torch optimizer over the same masters and the same ``state``,
whose groups are copied from it at each hand-off, so a scheduler stepping meanwhile changes nothing in
flight.

Drain points, where no update may be in flight or pending: ``synchronize()`` (call it at the end of
training, before reading the weights), ``state_dict``/``load_state_dict``, and the store's
``master_state_dict``/``load_master_state_dict`` (the store's ``drain`` hook is ``synchronize``). The
thread is not a daemon, so an interpreter exiting mid-update finishes it before it goes.

Errors: an exception in the thread is raised by the next ``step()``/``synchronize()``, with a note. The
update's gradients are then dropped, and the working weights stay those before it; the masters and
Adam's moments may be partly stepped (torch steps tensor by tensor), so an exact resume reloads them
from a checkpoint. The fp16 loss scaler is refused: its scale would change while the next step's loss
is being scaled with it (use bf16, or the synchronous ``HostOptimizer``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .host_optimizer import OPTIMIZERS, HostOptimizer, HostStepResult
from .host_store import HostStore
from .loss_scaler import DynamicLossScaler

__all__ = ["AsyncHostOptimizer"]


@dataclass(eq=False)
class _Update:
    """One update in flight: its thread, when it is done, and what it gave."""

    index: int
    done: threading.Event = field(default_factory=threading.Event)
    result: HostStepResult | None = None
    error: BaseException | None = None


class AsyncHostOptimizer:
    """``HostOptimizer``'s step, one step stale, on a thread (see the module docstring).

    Takes ``HostOptimizer``'s keyword arguments but ``prepare_store``: ``store`` is double-buffered here
    (``double_buffer``).
    """

    def __init__(self, store: HostStore, *, loss_scaler: DynamicLossScaler | None = None, **settings) -> None:
        if loss_scaler is not None and loss_scaler.enabled:
            raise ValueError(
                "the one-step-stale optimizer cannot use an fp16 loss scaler (its scale would move while the "
                "next step's loss is scaled with it): train in bf16, or use the synchronous optimizer"
            )
        self.store = store
        # Double-buffered only once every setting is checked (a refused optimizer leaves the store as it
        # was), and before the torch optimizer is built: fp32 parameters get masters of their own there.
        self.host = HostOptimizer(store, loss_scaler=loss_scaler, prepare_store=HostStore.double_buffer, **settings)
        self.torch_optimizer: torch.optim.Optimizer = self.host.torch_optimizer
        """What callers see: give it to an LR scheduler; its ``state`` is the thread's."""
        groups = [dict(g) for g in self.torch_optimizer.param_groups]
        self._stepper = OPTIMIZERS[self.host.name](groups, self.host)
        self._stepper.state = self.torch_optimizer.state
        self._pending: _Update | None = None
        self._handed_off = 0
        self.last_result: HostStepResult | None = None
        """The latest update applied to the working weights (None before the first is)."""
        store.drain = self.synchronize

    @property
    def param_groups(self) -> list[dict]:
        return self.torch_optimizer.param_groups

    @property
    def in_flight(self) -> bool:
        """Whether an update was handed off and not yet synchronized."""
        return self._pending is not None

    def pending_update(self) -> Callable[[], bool] | None:
        """The update handed off and not yet synchronized, as a function that waits for it to end without
        applying it (``synchronize`` applies it) and tells whether it wrote new weights into the back working
        buffers (False when it skipped the step or failed; its error is raised by ``synchronize``). None when
        no update is in flight. An executor running the next iteration before this one's end reads those
        buffers once it returns True (``HostView.back``)."""
        update = self._pending
        if update is None:
            return None

        def wait_written() -> bool:
            update.done.wait()
            return update.error is None and not update.result.skipped

        return wait_written

    def step(self) -> HostStepResult | None:
        """Apply the previous hand-off's update to the working weights, then hand this step's gradients
        to the thread. Returns the update just applied (None on the first call)."""
        applied = self.synchronize()
        spent = self.store.swap_grads()
        for mine, theirs in zip(self._stepper.param_groups, self.torch_optimizer.param_groups, strict=True):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        self._stepper.state = self.torch_optimizer.state  # a load_state_dict may have replaced it
        # What torch's LR schedulers mark when the optimizer they wrap steps (lr_scheduler.py, wrap_step):
        # the twin steps instead, and a scheduler stepped after this hand-off must not warn that none did.
        self.torch_optimizer._opt_called = True
        self._handed_off += 1
        update = _Update(self._handed_off)
        thread = threading.Thread(target=self._run, args=(update, spent), daemon=False,
                                  name=f"bubbleless-host-optimizer-{update.index}")
        self._pending = update
        try:
            thread.start()
        except BaseException:
            self._pending = None
            self.store.swap_grads()  # the gradients go back in front, not lost
            raise
        return applied

    def synchronize(self) -> HostStepResult | None:
        """Wait for the update in flight and put its weights in front; its result (None if none was)."""
        update = self._pending
        if update is None:
            return None
        update.done.wait()  # an Event, not Thread.join: a Ctrl-C here leaves the update pending, not lost
        self._pending = None
        if update.error is not None:
            error = update.error
            if hasattr(error, "add_note"):
                error.add_note(
                    f"raised in the host optimizer thread applying the gradients of optimizer step "
                    f"{update.index} (handed off one step earlier); they were dropped and the working weights "
                    "are those before that update; the fp32 masters and optimizer state may be partly stepped: "
                    "reload them from a checkpoint for an exact resume"
                )
            raise error
        if not update.result.skipped:
            self.store.swap_working()
        self.last_result = update.result
        return update.result

    def _run(self, update: _Update, spent: list[torch.Tensor]) -> None:
        try:
            torch.set_num_threads(torch.get_num_threads())  # this thread's OpenMP team, as pool workers do
            masters = [hp.master for hp in self.store.trainable]
            for master, grad in zip(masters, spent, strict=True):
                master.grad = grad
            update.result = self.host.update(masters, self._stepper)
            if not update.result.skipped:
                self.store.write_spare_working()
        except BaseException as error:  # noqa: BLE001 - raised by the next synchronize()
            update.error = error
        finally:
            try:
                for grad in spent:
                    grad.zero_()
            finally:
                update.done.set()

    def state_dict(self) -> dict:
        """``HostOptimizer.state_dict`` after ``synchronize()``: every handed-off update applied."""
        self.synchronize()
        return self.host.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.synchronize()
        self.host.load_state_dict(state)
        self._stepper.state = self.torch_optimizer.state
