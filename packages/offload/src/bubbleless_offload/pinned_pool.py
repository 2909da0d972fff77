"""``PinnedPool``: host buffers reused across jobs, pinned (page-locked) when an accelerator reads them.

Pinning is what makes a host-to-device copy asynchronous (``non_blocking=True``) and fast, but pinning
a buffer is slow (a system call that locks its pages), so buffers are kept and handed out again rather
than pinned per transfer. Buffers are matched by byte size: a released buffer serves any later request
of the same size, whatever its shape or dtype.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import torch

__all__ = ["PinnedPool"]


class PinnedPool:
    """Reusable host buffers; thread-safe (every device thread may acquire and release).

    ``pin``: page-lock the buffers (needs an accelerator build with a device present); False gives plain
    ``torch.empty`` buffers, still reused, for machines with little RAM or no accelerator.
    """

    def __init__(self, *, pin: bool) -> None:
        if pin and not torch.cuda.is_available():
            raise ValueError(
                "PinnedPool(pin=True) needs an accelerator (torch.cuda.is_available() is False here); "
                "pass pin=False"
            )
        self.pin = pin
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}  # byte size -> released uint8 buffers
        self._in_use: dict[int, torch.Tensor] = {}  # data_ptr -> the uint8 buffer handed out
        self._pending: list[tuple[torch.Tensor, tuple]] = []  # released, reusable once the events complete
        self._bytes_in_use = 0
        self._bytes_free = 0
        self._bytes_pending = 0

    @property
    def bytes_in_use(self) -> int:
        """Bytes of buffers acquired and not yet released."""
        return self._bytes_in_use

    @property
    def bytes_reserved(self) -> int:
        """Bytes the pool holds in all: in use, released but still read or written by a copy, kept for reuse."""
        return self._bytes_in_use + self._bytes_pending + self._bytes_free

    def acquire(self, shape: Sequence[int] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous host tensor of ``shape`` and ``dtype`` (contents undefined); give it back with ``release``."""
        shape = torch.Size(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:  # nothing to pin or reuse; release() accepts it and does nothing
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            if not self._free.get(nbytes):  # look at the copies still using released buffers only when needed
                self._reclaim()
            kept = self._free.get(nbytes)
            buffer = kept.pop() if kept else None
            if buffer is not None:
                self._bytes_free -= nbytes
                self._in_use[buffer.data_ptr()] = buffer
                self._bytes_in_use += nbytes
        if buffer is None:  # allocate (and pin) outside the lock: it can take milliseconds
            buffer = torch.empty(shape, dtype=dtype, pin_memory=self.pin)
            with self._lock:
                self._in_use[buffer.data_ptr()] = buffer
                self._bytes_in_use += nbytes
        if buffer.dtype == dtype and buffer.shape == shape:  # reused as it was last handed out
            return buffer
        return buffer.view(-1).view(torch.uint8).view(dtype).view(shape)

    def release(self, tensor: torch.Tensor, *, after=()) -> None:
        """Return a tensor from ``acquire`` for reuse. ``after``: events of copies still reading or writing it
        (a device's asynchronous copies); it is handed out again only once every one has completed.
        Without them, any copy of it must be done."""
        if tensor.numel() == 0:
            return
        events = tuple(after)
        with self._lock:
            buffer = self._in_use.pop(tensor.data_ptr(), None)
            if buffer is not None and buffer.data_ptr() == tensor.data_ptr():
                buffer = tensor  # kept as handed out: the next request of its shape and dtype takes it as is
            if buffer is None:
                raise ValueError(
                    "release() got a tensor this pool did not hand out (or one released already); "
                    "release exactly the tensor acquire() returned, once"
                )
            nbytes = _nbytes(buffer)
            self._bytes_in_use -= nbytes
            if events:
                self._pending.append((buffer, events))
                self._bytes_pending += nbytes
            else:
                self._keep(buffer)

    def _keep(self, buffer: torch.Tensor) -> None:
        """``buffer`` free for reuse (locked)."""
        self._bytes_free += _nbytes(buffer)
        self._free.setdefault(_nbytes(buffer), []).append(buffer)

    def _reclaim(self) -> None:
        """Released buffers whose copies have completed become free for reuse (locked)."""
        still = []
        for buffer, events in self._pending:
            if all(event.query() for event in events):
                self._bytes_pending -= _nbytes(buffer)
                self._keep(buffer)
            else:
                still.append((buffer, events))
        self._pending = still

    def clear(self) -> None:
        """Drop the buffers kept for reuse (in-use buffers, and released ones a copy still uses, stay),
        returning their memory."""
        with self._lock:
            self._reclaim()
            self._free.clear()
            self._bytes_free = 0

    def __repr__(self) -> str:
        return f"PinnedPool(pin={self.pin}, bytes_in_use={self.bytes_in_use}, bytes_reserved={self.bytes_reserved})"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
