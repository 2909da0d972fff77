"""``WeightUploads``: a device's weight uploads cut into chunks and paced behind its activation uploads.

A round-robin device uploads the next job's weights while the current job computes, and meanwhile
receives that job's activations one micro-batch at a time. Both cross the same host-to-device link: a
job's weights issued all at once would queue every activation copy behind hundreds of megabytes, and
the compute stream, which needs the activation now, would wait for weights it needs only later.
RoundPipe cuts weight uploads into chunks queued behind pending activation uploads; so does this.

- ``paced`` (the default on an accelerator): ``upload`` returns at once and a pump thread issues the
  copies chunk by chunk (each at most ``chunk_bytes``, a large tensor sliced, small ones grouped) on the
  ``weights_in`` stream, keeping at most ``window`` chunks in flight (counted across pump threads). An
  activation upload the caller queues inside ``with uploads.activation_first():`` goes first: no weight
  chunk is issued while it is being queued, and the next one waits for it on the device, so a new
  activation copy waits behind at most ``window`` chunks, never behind a whole job. The pump thread
  starts when there is work and ends when the queue is empty.
- Not paced (the default on CPU, where every copy is synchronous and nothing overlaps): ``upload``
  issues every copy on the calling thread, as one chunk.

Priorities, in order: activation uploads; weight uploads in the order ``upload`` was called (the job
running now before the job prefetched). ``Upload.wait(stream)`` is what a consumer calls before
reading the weights; it blocks the calling thread only until the last chunk is *issued*, then orders
``stream`` after it on the device, as an event's ``wait`` does (so queue a job's input before waiting
for its weights: the input then goes ahead of the weights' last chunks).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Sequence

import torch

from .streams import DeviceStreams, record_blocking, stream_context

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_WINDOW", "Upload", "WeightUploads", "plan_chunks"]

DEFAULT_CHUNK_BYTES = 32 << 20
"""32 MiB: about 1.3 ms over PCIe 4.0 x16, so an activation copy waits at most a few milliseconds."""
DEFAULT_WINDOW = 2
"""Chunks in flight: one copying, one queued, so the link never idles between chunks."""

Copy = tuple[torch.Tensor, torch.Tensor]  # (host source, device destination) of the same shape


def plan_chunks(copies: Sequence[Copy], chunk_bytes: int) -> list[list[Copy]]:
    """``copies`` cut into chunks of at most ``chunk_bytes`` each, in order: a contiguous tensor larger
    than that is sliced along its flattened elements (at least one element a slice), consecutive smaller
    ones are grouped; a non-contiguous tensor larger than a chunk goes as one chunk of its own."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes}")
    chunks: list[list[Copy]] = []
    group: list[Copy] = []
    group_bytes = 0
    for source, destination in copies:
        if source.shape != destination.shape:
            raise ValueError(f"a copy's source {tuple(source.shape)} and destination {tuple(destination.shape)} differ")
        nbytes = source.numel() * source.element_size()
        if group and group_bytes + nbytes > chunk_bytes:
            chunks.append(group)
            group, group_bytes = [], 0
        sliceable = source.is_contiguous() and destination.is_contiguous()
        if nbytes <= chunk_bytes or not sliceable:
            group.append((source, destination))
            group_bytes += nbytes
            continue
        flat_source, flat_destination = source.reshape(-1), destination.view(-1)
        step = max(1, chunk_bytes // source.element_size())
        for start in range(0, source.numel(), step):
            chunks.append([(flat_source[start:start + step], flat_destination[start:start + step])])
    if group:
        chunks.append(group)
    return chunks


class Upload:
    """One ``WeightUploads.upload``: its chunks still to issue and, once all are issued, the event of the last.

    Has ``wait(stream)``, ``synchronize()`` and ``query()`` like an event, and ``cancel()``."""

    def __init__(self, chunks: list[list[Copy]], nbytes: int, lock: threading.Lock) -> None:
        self.nbytes = nbytes
        self._lock = lock  # the owning WeightUploads' lock, which guards the chunks
        self._chunks = deque(chunks)
        self._issued = threading.Event()
        self._event = None
        self._error: BaseException | None = None
        self._cancelled = False

    @property
    def chunks_left(self) -> int:
        """Chunks not yet issued."""
        return len(self._chunks)

    def wait(self, stream=None) -> None:
        """Block until every chunk is issued, then make ``stream`` wait for the copies on the device."""
        self._last().wait(stream)

    def synchronize(self) -> None:
        """Block until every copy has completed."""
        self._last().synchronize()

    def query(self) -> bool:
        """True once every chunk is issued and has completed (False while any is still queued)."""
        return self._issued.is_set() and self._error is None and not self._cancelled and self._event.query()

    def cancel(self) -> None:
        """Issue none of the chunks not issued yet (a released job's weights); ``wait`` then raises."""
        with self._lock:
            self._cancelled = True
            self._chunks.clear()

    def _last(self):
        self._issued.wait()
        if self._error is not None:
            raise RuntimeError(f"uploading {self.nbytes} bytes of weights failed: {self._error!r}") from self._error
        if self._cancelled:
            raise ValueError("this upload was cancelled (its job was released before its weights arrived)")
        return self._event

    def _finish(self, event=None, error: BaseException | None = None) -> None:
        self._event, self._error = event, error
        self._issued.set()


class WeightUploads:
    """The weight uploads of one device (``streams``: its ``DeviceStreams``); see the module docstring.

    ``paced``: None means paced on an accelerator, not on CPU. ``chunk_bytes`` and ``window`` apply
    when paced. Thread-safe: any thread may upload and queue activations."""

    def __init__(self, streams: DeviceStreams, *, paced: bool | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 window: int = DEFAULT_WINDOW) -> None:
        if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive number of bytes, got {chunk_bytes!r}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be at least 1 chunk in flight, got {window!r}")
        if not (paced is None or isinstance(paced, bool)):
            raise ValueError(f"paced must be True, False or None (paced on an accelerator), got {paced!r}")
        self.streams = streams
        self.paced = (not streams.is_cpu) if paced is None else paced
        self.chunk_bytes = chunk_bytes
        self.window = window
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # an activation upload ended
        self._queue: deque[Upload] = deque()
        self._activations: list = []  # events of activation uploads the next weight chunk waits for
        self._activations_open = 0  # activation uploads being queued now: no weight chunk goes meanwhile
        self._in_flight: deque = deque()  # (upload, event) of the chunks issued last, across pump threads
        self._pump: threading.Thread | None = None

    @property
    def queued(self) -> int:
        """Uploads with chunks not yet issued."""
        with self._lock:
            return len(self._queue)

    def upload(self, copies: Sequence[Copy]) -> Upload:
        """Copy each host source into its device destination on ``weights_in``; the ``Upload`` tracking them.

        The destinations must stay allocated until the upload completes (the caller owns them)."""
        copies = list(copies)
        nbytes = sum(source.numel() * source.element_size() for source, _ in copies)
        if not self.paced:
            upload = Upload([], nbytes, self._lock)
            upload._finish(self._issue(copies, []))  # nothing queued, so no activation to wait for
            return upload
        upload = Upload(plan_chunks(copies, self.chunk_bytes), nbytes, self._lock)
        with self._lock:
            if not upload._chunks:
                upload._finish(self.streams.record(self.streams.weights_in))
                return upload
            self._queue.append(upload)
            if self._pump is None:
                self._start_pump()
        return upload

    def activation_first(self):
        """Around queueing an activation upload on ``activations_in`` (a context manager): weight chunks
        not issued yet wait, on the host while it is being queued (a copy from pageable memory blocks,
        and is staged in pieces other copies could slip between), then on the device until it has landed.
        Nothing to order when not paced: every weight copy is issued by the time ``upload`` returns."""
        return self._activation_first() if self.paced else _NOTHING

    @contextlib.contextmanager
    def _activation_first(self):
        with self._lock:
            self._activations_open += 1
        try:
            yield
        finally:
            event = self.streams.record(self.streams.activations_in)
            with self._lock:
                self._activations_open -= 1
                if self._queue:  # nothing waiting: nothing to order
                    self._activations.append(event)
                self._changed.notify_all()

    # ---- internals ----

    def _start_pump(self) -> None:
        """A pump thread for the queue (locked). If no thread can start, every queued upload fails with why."""
        pump = threading.Thread(target=self._run_pump, name=f"bubbleless-weight-uploads-{self.streams.device}",
                                daemon=True)
        try:
            pump.start()
        except BaseException as error:
            for upload in self._queue:
                upload._chunks.clear()
                upload._finish(error=error)
            self._queue.clear()
            raise
        self._pump = pump

    def _issue(self, chunk: list[Copy], waits: list):
        """Queue ``chunk``'s copies on ``weights_in`` after the events in ``waits``; the event of their end."""
        stream = self.streams.weights_in
        for event in waits:
            event.wait(stream)
        with _on_device(self.streams.device), stream_context(stream):
            for source, destination in chunk:
                destination.copy_(source, non_blocking=source.is_pinned())
        return record_blocking(stream)

    def _next_chunk(self):
        """(upload, chunk) to issue next, or None once the queue is empty (the pump then ends) (locked)."""
        while self._queue and not self._queue[0]._chunks:  # cancelled before its next chunk
            self._queue.popleft()._finish()
        if not self._queue:
            self._pump = None
            self._activations.clear()  # reported for uploads that are all issued now
            return None
        upload = self._queue[0]
        return upload, upload._chunks.popleft()

    def _run_pump(self) -> None:
        """Issue queued chunks in order, at most ``window`` in flight, until the queue is empty."""
        torch.set_num_threads(torch.get_num_threads())  # a new thread's OpenMP team is every core otherwise
        while True:
            with self._lock:
                taken = self._next_chunk()
            if taken is None:
                return
            upload, chunk = taken
            try:
                while len(self._in_flight) >= self.window:
                    owner, event = self._in_flight.popleft()
                    try:
                        event.synchronize()
                    except BaseException as error:  # noqa: BLE001 - a chunk of an upload already handed out
                        if owner is upload:
                            raise
                        owner._error = owner._error or error
                with self._changed:
                    while self._activations_open:
                        self._changed.wait()
                    if upload._cancelled:  # released meanwhile: drop the chunk (and its hold on the memory)
                        continue
                    waits, self._activations = self._activations, []
                event = self._issue(chunk, waits)
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits for this upload
                with self._lock:
                    upload._chunks.clear()
                    if self._queue and self._queue[0] is upload:
                        self._queue.popleft()
                upload._finish(error=error)
                continue
            self._in_flight.append((upload, event))
            with self._lock:
                if not upload._chunks:
                    if self._queue and self._queue[0] is upload:
                        self._queue.popleft()
                    upload._finish(event)


_NOTHING = contextlib.nullcontext()


def _on_device(device: torch.device):
    """The CUDA device context for a thread issuing copies to ``device`` (nothing on CPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
