"""The board the device pool's workers meet on: events of one step and the host tensors they carry.

An event is what the schedule's layout says an action produces (``("F", job, mb)``, ``("G", job, mb)``,
``("R", job, mb)``, ``("LOAD", job)``); a worker posts it with its payload (host copies of activations or
gradients, and the copy's completion event) when the action ends, and a worker whose action requires it
waits here. When any worker fails, ``fail`` wakes every waiter with ``PoolAborted`` so the other
workers stop at their next wait instead of hanging, and the step raises the first failure.
"""

from __future__ import annotations

import threading
import time


class PoolAborted(RuntimeError):
    """Raised inside a worker when another worker of the same step failed first."""


class PoolTimeout(RuntimeError):
    """A worker waited longer than the pipeline's timeout for an event no worker produced."""


class Board:
    """Thread-safe event -> payload map for one step (reset between steps)."""

    def __init__(self, timeout: float, readers: dict | None = None, release=None) -> None:
        self.timeout = timeout
        self._readers = dict(readers or {})  # event -> reads left before its payload is dropped
        self._release = release  # (payload, events of the copies that read it) -> None: its host buffers back
        self._read_by: dict = {}  # event -> events of its readers' copies so far
        self._cond = threading.Condition()
        self._values: dict = {}
        self._failure: BaseException | None = None

    def put(self, event, payload=None) -> None:
        with self._cond:
            self._values[event] = payload
            self._cond.notify_all()

    def get(self, event, who: str):
        """The payload of ``event`` once posted; returns (payload, seconds waited)."""
        with self._cond:
            if event in self._values and self._failure is None:
                return self._values[event], 0.0
            start = time.perf_counter()
            deadline = start + self.timeout
            while event not in self._values or self._failure is not None:
                if self._failure is not None:
                    raise PoolAborted(f"{who} stopped: another worker failed ({type(self._failure).__name__})")
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise PoolTimeout(
                        f"{who} waited {self.timeout:g} s for {event!r}, which no worker produced; the schedule "
                        "passed validation, so a worker is stuck (raise timeout= if a job is legitimately slow)"
                    )
                self._cond.wait(left)
            return self._values[event], time.perf_counter() - start

    def fail(self, error: BaseException) -> None:
        """Record the first failure and wake every waiter."""
        with self._cond:
            if self._failure is None:
                self._failure = error
            self._cond.notify_all()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def read_done(self, event, copied=None) -> None:
        """One reader of ``event`` is done with its payload (``copied``: the event of its copy out of the
        host tensors, if that may still run); after the last, the host tensors go (back to the pool)."""
        with self._cond:
            if copied is not None:
                self._read_by.setdefault(event, []).append(copied)
            left = self._readers.get(event, 0) - 1
            self._readers[event] = left
            if left == 0 and event in self._values:
                self._drop(event)  # the event stays posted; its tensors are freed

    def close(self) -> None:
        """Give back the host tensors of every payload still held (a step that failed, or one no reader
        finished). Call once no worker uses the board."""
        with self._cond:
            for event in list(self._values):
                self._drop(event)

    def _drop(self, event) -> None:
        payload, self._values[event] = self._values[event], None
        if payload is not None and self._release is not None:
            self._release(payload, tuple(self._read_by.pop(event, ())))
