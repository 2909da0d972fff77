"""``GradientAdds``: a host store's gradient additions, run on one background thread.

A device worker's STORE copies its job's gradients into pinned host staging buffers on its copy
stream; adding them into the fp32 accumulators is host work (memory-bound: about 10 bytes moved per
parameter) that, done on the worker's thread, kept the device idle (its next compute not launched)
for as long as it ran. Queued here instead, a thread waits for each batch's copy and adds it while the
worker goes on.

- Order: first in, first out; one thread per store, whose ``add_`` calls use torch's intra-op threads.
- Bounded: at most ``limit_bytes`` of queued batches wait at once; a caller queueing more blocks until
  adds finish. A batch alone always goes, however large.
- Failures: a batch's work that raises is kept, and raised by the next ``flush`` (after every batch
  queued before it has run); ``settle`` waits the same way and returns them instead (a failed step,
  whose sums are dropped anyway).

Whoever reads or zeroes the accumulators calls ``flush``/``settle`` first (``HostStore`` does, in each
of its methods that touch them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["ADDS_IN_FLIGHT_BYTES", "GradientAdds"]

ADDS_IN_FLIGHT_BYTES = 512 << 20
"""Staged gradient bytes a store lets wait for their adds at once (pinned host memory held meanwhile)."""


class GradientAdds:
    """A first-in first-out queue of host additions, run on one thread started at the first ``submit``."""

    def __init__(self, *, limit_bytes: int = ADDS_IN_FLIGHT_BYTES) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes <= 0:
            raise ValueError(f"limit_bytes is the most staged bytes waiting at once, a positive int; got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self._cond = threading.Condition()
        self._in_flight = 0
        self._futures: list[Future] = []
        self._executor: ThreadPoolExecutor | None = None

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of the batches queued and not yet added."""
        return self._in_flight

    def submit(self, work: Callable[[], None], nbytes: int) -> None:
        """Queue ``work`` (waits for its copies, adds, gives its staging back), ``nbytes`` of staging held until
        it has run; blocks while that would put more than ``limit_bytes`` in flight behind other batches."""
        with self._cond:
            while self._in_flight and self._in_flight + nbytes > self.limit_bytes:
                self._cond.wait()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="bubbleless-grad-adds")
            future = self._executor.submit(self._run, work, nbytes)  # raises at interpreter shutdown: not counted
            self._in_flight += nbytes
            self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
            self._futures.append(future)

    def _run(self, work: Callable[[], None], nbytes: int) -> None:
        try:
            work()
        finally:
            with self._cond:
                self._in_flight -= nbytes
                self._cond.notify_all()

    def settle(self) -> list[BaseException]:
        """Wait until every batch queued so far has run; the errors they raised, in queue order (forgotten here).
        A batch is forgotten only once waited for: an interrupt of the wait leaves the rest for the next call."""
        with self._cond:
            futures = list(self._futures)
        waited = 0
        try:
            for future in futures:
                future.exception()  # waits; an interrupt of this wait propagates
                waited += 1
        finally:
            done = {id(future) for future in futures[:waited]}
            with self._cond:
                self._futures = [future for future in self._futures if id(future) not in done]
        return [error for error in (future.exception() for future in futures) if error is not None]

    def flush(self) -> None:
        """``settle``, raising the first error a batch raised (the others noted on it)."""
        errors = self.settle()
        if errors:
            first = errors[0]
            if len(errors) > 1 and hasattr(first, "add_note"):
                first.add_note(f"{len(errors) - 1} later gradient batch(es) failed too: {errors[1:]!r}")
            raise first

    def __repr__(self) -> str:
        return f"GradientAdds(in_flight_bytes={self._in_flight}, limit_bytes={self.limit_bytes})"
