"""Consecutive steps of the round-robin pool, overlapped: ``RoundRobinPipeline.steps(batches)``.

``step()`` runs one iteration and returns when every device is done, so the devices that end first
wait for the last ones' drain. With the one-step-stale optimizer nothing in step k + 1 needs step k's
gradients, only the weights of the update handed off at the end of step k - 1 (``host_optimizer_async``),
so here step k + 1's rows start while step k drains: as each device ends its row of step k it takes the
next row of step k + 1 not yet taken, rows dealt in the order one iteration alone starts their first
compute (``deal_order``): the first-free rule ``bubbleless_schedules.steady_state(..., rotate=True)``
simulates, online. A device learns its next row when it frees, so its first upload of that row is not
prefetched during the previous one.

Two steps run at once at most (step k + 2 is launched once step k ended), each with its own board and
its own host tensors (``bubbleless_offload.HostView``), so the arithmetic is exactly ``step()`` in a loop
over the asynchronous optimizer:

- the first step of a run reads the front weights and adds into the front accumulators, as ``step()``;
- a step that starts while the one before still runs reads the back working buffers the update in
  flight writes (waiting for it to end; the weights before it if it skipped) and adds into the spare
  accumulators that update zeroes at its end;
- ``accumulate=n``: n steps per optimizer step, the later ones with the first one's view; the update is
  handed off when the n-th ends (``AsyncHostOptimizer.step``: its pointer swaps leave the running step's
  view as it is).

Errors: the first exception of any device in step k stops step k and the one after it at their next
wait, while a step before k runs on to its end and is handed off and yielded; the devices are then
cleared, the dropped steps' gradients too (with those accumulated since the last optimizer step), and
the next ``next()`` raises it, noted with the device, step, row and action, and which steps to run again.
A batch that is not a valid pair, or an exception drawing it, is raised once the steps drawn before it
are yielded. Closing the iterator early (a ``break``) abandons the steps still running the same way; an
update in flight is never touched (``pipe.synchronize()`` applies it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from bubbleless_offload import HostView
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer
from bubbleless_schedules import Schedule, simulate
from bubbleless_schedules.action import Kind

from .batches import check_batch, split_batch
from .pool_board import PoolAborted
from .pool_worker import PoolStep, WorkerState, device_thread

__all__ = ["StepSpan", "deal_order", "overlapped_steps"]

_TRANSFERS = (Kind.LOAD, Kind.STORE)


@dataclass(frozen=True)
class StepSpan:
    """One action of an overlapped run, as it ran: wall-clock seconds (``time.time``)."""

    step: int
    """The step of the run (0 = the first batch)."""
    device: int
    row: int
    """The row of the schedule (``schedule.actions[row]``) the device ran in this step."""
    action: object
    start: float
    end: float


def deal_order(schedule: Schedule, costs) -> tuple[int, ...]:
    """Rows in the order one iteration alone starts their first compute (not a LOAD or STORE), simulated with
    ``costs``; ties by row. The order a later step's rows go to the devices as they free."""
    first = {row: float("inf") for row in range(schedule.num_workers)}
    for span in simulate(schedule, costs).spans:
        if span.action.kind not in _TRANSFERS:
            first[span.worker] = min(first[span.worker], span.start)
    return tuple(sorted(first, key=lambda row: (first[row], row)))


class _ViewOnce:
    """An iteration's ``HostView``, resolved by the first device that needs it (it may wait for an update)."""

    def __init__(self, resolve: Callable[[], HostView]) -> None:
        self._resolve = resolve
        self._lock = threading.Lock()
        self.view: HostView | None = None

    def __call__(self) -> HostView:
        with self._lock:
            if self.view is None:
                self.view = self._resolve()
                self._resolve = None  # it holds the step before's: a long run would keep every step's view
            return self.view


@dataclass(eq=False)
class _Iteration:
    index: int
    step: PoolStep
    view: _ViewOnce
    rows_left: list[int]
    states: dict[int, WorkerState]
    hands_off: bool
    """Whether the optimizer steps when this one ends (the last of its accumulation window)."""
    rows_done: int = 0
    processed: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class _Run:
    """One ``steps()`` call: the device threads, the iterations in flight, the first failure."""

    def __init__(self, pipe, autocast, accumulate: int) -> None:
        self.pipe = pipe
        self.autocast = autocast
        self.accumulate = accumulate
        self.order = list(deal_order(pipe.schedule, pipe.stage_costs))
        self.cond = threading.Condition()
        self.iterations: dict[int, _Iteration] = {}
        self.closed = False
        self.failure: BaseException | None = None
        self.failed_from: int | None = None
        """The first step abandoned: it and every later one stop; the ones before run to their end."""
        self.failed_at: dict[int, tuple[int, int]] = {}  # device -> (step, row) of its error
        self.errors: dict[int, BaseException] = {}
        self.spans: list[StepSpan] = []
        self.exited = [threading.Event() for _ in pipe.workers]

    # -- launching (the caller's thread) --------------------------------------------------------------
    def launch(self, index: int, inputs, targets) -> None:
        pipe = self.pipe
        check_batch(inputs, targets, pipe.num_microbatches)
        cpu = torch.device("cpu")
        step = PoolStep(split_batch(inputs, pipe.num_microbatches, cpu), split_batch(targets, pipe.num_microbatches, cpu),
                        pipe._board(), pipe.loss_fn)
        iteration = _Iteration(index, step, self._view_for(index), list(self.order),
                               {row: WorkerState(step) for row in range(len(pipe.workers))},
                               hands_off=(index + 1) % self.accumulate == 0)
        with self.cond:
            self.iterations[index] = iteration
            if self._abandoned(index):
                step.board.fail(self.failure)
                iteration.done.set()
            self.cond.notify_all()

    def _abandoned(self, index: int) -> bool:
        return self.failed_from is not None and index >= self.failed_from

    def _view_for(self, index: int) -> _ViewOnce:
        """The host tensors of step ``index``, as the module docstring says (called when it is launched)."""
        store, before = self.pipe.store, self.iterations.get(index - 1)
        if before is not None and index % self.accumulate != 0:
            return before.view  # the same optimizer step: the same weights and accumulators
        if before is None or before.processed:
            front = HostView.front(store)
            return _ViewOnce(lambda: front)
        back, written = HostView.back(store), self.pipe.optimizer.pending_update()
        previous = before.view

        def resolve() -> HostView:
            if written is not None and written():
                return back
            return back.with_working_of(previous())

        return _ViewOnce(resolve)

    # -- the device threads ---------------------------------------------------------------------------
    def device_loop(self, device: int) -> None:
        worker, index = self.pipe.workers[device], 0
        try:
            with device_thread(worker, self.autocast):
                while self._take_and_run(worker, device, index):
                    index += 1
        except BaseException as error:  # noqa: BLE001 - setting the thread up failed (its device, say)
            self._fail(error, device, index, None)
        finally:
            self.exited[device].set()

    def _take_and_run(self, worker, device: int, index: int) -> bool:
        with self.cond:
            while index not in self.iterations and not self.closed and not self._abandoned(index):
                self.cond.wait()
            if self._abandoned(index) or index not in self.iterations:
                return False
            iteration = self.iterations[index]
            row = device if index == 0 else iteration.rows_left.pop(0)
        state = iteration.states[row]
        try:
            worker.take_row(self.pipe.schedule.actions[row], iteration.view())
            self.pipe.interpreter.run(worker, worker.actions, state)
        except BaseException as error:  # noqa: BLE001 - raised by the caller's next()
            self._fail(error, device, index, row)
            return False
        with self.cond:
            self.spans.extend(StepSpan(index, device, row, a, s, e) for a, s, e in state.spans)
            iteration.rows_done += 1
            if iteration.rows_done == len(self.pipe.workers):
                iteration.done.set()
            self.cond.notify_all()
        return True

    def _fail(self, error: BaseException, device: int, index: int, row: int | None) -> None:
        with self.cond:
            self.errors[device] = error
            self.failed_at[device] = (index, row)
            if self.failure is None and not isinstance(error, PoolAborted):
                self.failure = error
            self._abandon_from(index, self.failure or error)

    def _abandon_from(self, index: int, reason: BaseException) -> None:
        """Stop step ``index`` and every later one (locked); the steps before it run on to their end."""
        self.failed_from = index if self.failed_from is None else min(self.failed_from, index)
        for at, iteration in self.iterations.items():
            if at >= self.failed_from:
                iteration.step.board.fail(reason)
                iteration.done.set()  # wakes the caller
        self.cond.notify_all()

    # -- the caller's side ------------------------------------------------------------------------
    def forget(self, index: int) -> None:
        """Drop step ``index`` (ended: no device uses its board) and what its board still holds."""
        with self.cond:  # devices walk the iterations under the lock when one fails
            iteration = self.iterations.pop(index, None)
        if iteration is not None:
            iteration.step.board.close()

    def close_boards(self) -> None:
        """After ``stop`` (and ``abandon``): give back what the steps' boards still hold."""
        for iteration in list(self.iterations.values()):
            iteration.step.board.close()

    def trace_until(self, index: int) -> tuple[StepSpan, ...]:
        """The spans of steps ``index - 1`` and ``index`` (the overlap between them); older ones are dropped."""
        with self.cond:
            self.spans = [span for span in self.spans if span.step >= index - 1]
            return tuple(span for span in self.spans if span.step <= index)

    def stop(self, reason: BaseException | None) -> None:
        """No more steps: let the devices leave (failing what runs, with ``reason``), wait until they have."""
        with self.cond:
            self.closed = True
            if reason is not None:
                self.failure = self.failure or reason
                running = [at for at, iteration in self.iterations.items() if not iteration.processed]
                if running:
                    self._abandon_from(min(running), self.failure)
            self.cond.notify_all()
        for exited in self.exited:
            exited.wait()

    def abandon(self) -> None:
        """After ``stop``: drop what unprocessed steps left on the devices and in their accumulators."""
        self.pipe.store.adds.settle()  # no queued add lands after the zeroing
        for iteration in self.iterations.values():
            if not iteration.processed and iteration.view.view is not None:
                iteration.view.view.zero_grads()
        for worker in self.pipe.workers:
            worker.reset()

    def explain(self, failure: BaseException) -> BaseException:
        for device, error in self.errors.items():
            if error is not failure or not hasattr(failure, "add_note"):
                continue
            worker, (index, row) = self.pipe.workers[device], self.failed_at[device]
            if row is None:
                where = "setting up its thread"
            else:
                done = len(self.iterations[index].states[row].spans)
                where = f"running {worker.actions[done] if done < len(worker.actions) else None} of row {row}"
            dropped = sorted(at for at in self.iterations if at >= self.failed_from)
            failure.add_note(
                f"raised on {worker.name} {where} in step {index} of the overlapped run "
                f"(0 = its first batch); steps {dropped} were abandoned, the devices cleared and their gradients "
                "dropped (with those accumulated since the last optimizer step): run their batches again; the "
                "steps before were handed to the optimizer and their losses yielded"
            )
        return failure


def _pairs(batches: Iterable) -> Iterator[tuple]:
    for position, item in enumerate(batches):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"steps() takes an iterable of (inputs, targets) pairs; item {position} is "
                             f"{type(item).__name__}" + (f" of length {len(item)}" if hasattr(item, "__len__") else ""))
        yield item


def check_overlap(pipe, accumulate) -> None:
    if not isinstance(pipe.optimizer, AsyncHostOptimizer):
        raise ValueError(
            "steps() overlaps each step with the next, which only the one-step-stale optimizer allows: build the "
            "pipeline with optimizer={'name': ..., 'asynchronous': True}, or call step() once per batch"
        )
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate is the number of steps per optimizer step, a positive integer; got {accumulate!r}")


def overlapped_steps(pipe, batches: Iterable, accumulate: int, autocast) -> Iterator[torch.Tensor]:
    """The body of ``RoundRobinPipeline.steps`` (checked by ``check_overlap`` first)."""
    run = _Run(pipe, autocast, accumulate)
    pairs = _pairs(batches)
    threads = [threading.Thread(target=run.device_loop, args=(d,), name=f"bubbleless-pool-{d}", daemon=True)
               for d in range(len(pipe.workers))]
    for thread in threads:
        thread.start()
    finished, launched, deferred = False, 0, []

    def launch(count: int) -> None:
        nonlocal launched
        if deferred:
            return
        try:
            for inputs, targets in _first(pairs, count):
                run.launch(launched, inputs, targets)
                launched += 1
        except Exception as error:  # noqa: BLE001 - a bad batch or a data error: raised once the steps
            deferred.append(error)  # launched before it have ended and been yielded

    try:
        launch(2)
        index = 0
        while index < launched:
            iteration = run.iterations[index]
            iteration.done.wait()
            if iteration.rows_done < len(pipe.workers):
                raise run.failure
            pipe.store.flush_adds()  # its STOREs' host adds (and those queued since: the next step's)
            if iteration.hands_off and pipe.replicas is not None:  # while the next step computes
                pipe.replicas.average(list(iteration.view().grads.values()))
            iteration.processed = True  # its gradients are the optimizer's from here: never dropped
            if iteration.hands_off:
                try:
                    pipe.last_step_result = pipe.optimizer.step()
                except Exception:  # an update handed off earlier failed: this step's gradients go too,
                    pipe.store.zero_grad()  # as step() drops them (the running step is abandoned below)
                    raise
            loss = torch.stack([iteration.step.losses[m].float().cpu() for m in range(pipe.num_microbatches)]).sum()
            launch(1)
            pipe._keep_trace(index, run.trace_until(index))
            run.forget(index - 1)  # its board's host tensors go; the one just processed stays
            index += 1
            if index == launched:  # the last: the devices leave the run before its loss is yielded, so the
                finished = True  # caller may call step() or evaluate at once, with the iterator not yet exhausted
                run.stop(None)
                pipe._own_rows()
            yield loss
        if deferred:
            raise deferred[0]
    except BaseException as error:
        run.stop(error if isinstance(error, (KeyboardInterrupt, GeneratorExit)) else PoolAborted("steps() stopped"))
        if not finished:
            run.abandon()
        if error is run.failure and not isinstance(error, (KeyboardInterrupt, GeneratorExit)):
            raise run.explain(error) from None
        raise
    finally:
        if not finished:  # no step ran (no batches), or the run was cut short: the threads leave
            run.stop(None)
            pipe._own_rows()
        run.close_boards()


def _first(pairs: Iterator, count: int) -> list:
    out = []
    for item in pairs:
        out.append(item)
        if len(out) == count:
            break
    return out
