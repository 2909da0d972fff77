"""``MemoryBudget``: bytes a device may hold, checked before anything is placed there.

On a GPU the allocator fails late and says little ("tried to allocate 2.00 GiB"); on a CPU "device"
nothing fails at all. Accounting every placement against a stated budget makes a plan that cannot fit
fail the same way everywhere, early, naming what was being placed. Weights (``DeviceWeights``) and
activations (the executor) reserve through one budget object per device.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["DeviceOutOfMemory", "MemoryBudget", "format_bytes"]


def format_bytes(nbytes: int) -> str:
    """``1536`` -> ``'1.50 KiB'``: sizes people can read in error messages."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class DeviceOutOfMemory(RuntimeError):
    """A reservation would pass a device's memory budget. The numbers are attributes too."""

    def __init__(self, *, device: str, what: str, requested: int, used: int, limit: int) -> None:
        self.device, self.what = device, what
        self.requested, self.used, self.limit = requested, used, limit
        super().__init__(
            f"{device}: no room for {what}: it needs {format_bytes(requested)} ({requested} bytes) but "
            f"{format_bytes(used)} ({used} bytes) of the {format_bytes(limit)} ({limit} bytes) budget are in "
            f"use; raise the memory budget or place less at once (smaller groups, more micro-batches, "
            f"shorter sequences)"
        )


class MemoryBudget:
    """Bytes reserved on one device against ``limit_bytes`` (None: count only, never refuse). Thread-safe."""

    def __init__(self, limit_bytes: int | None, device: torch.device | str) -> None:
        if limit_bytes is not None and limit_bytes < 0:
            raise ValueError(f"limit_bytes must be None (no limit) or >= 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self.device = str(torch.device(device))
        self._lock = threading.Lock()
        self._used = 0
        self._peak = 0

    @property
    def used(self) -> int:
        """Bytes reserved now."""
        return self._used

    @property
    def peak(self) -> int:
        """Most bytes reserved at once since construction or ``reset_peak``."""
        return self._peak

    def reserve(self, nbytes: int, what: str) -> None:
        """Reserve ``nbytes`` for ``what`` (words for the error message, e.g. "weights of layers (2, 3)")."""
        if nbytes < 0:
            raise ValueError(f"reserve() needs nbytes >= 0, got {nbytes} for {what}")
        with self._lock:
            if self.limit_bytes is not None and self._used + nbytes > self.limit_bytes:
                raise DeviceOutOfMemory(
                    device=self.device, what=what, requested=nbytes, used=self._used, limit=self.limit_bytes
                )
            self._used += nbytes
            self._peak = max(self._peak, self._used)

    def free(self, nbytes: int) -> None:
        """Give back ``nbytes`` reserved earlier."""
        with self._lock:
            if nbytes < 0 or nbytes > self._used:
                raise ValueError(f"free({nbytes}) on {self.device}: only {self._used} bytes are reserved")
            self._used -= nbytes

    def reset_peak(self) -> None:
        """Start measuring the peak again from what is reserved now."""
        with self._lock:
            self._peak = self._used

    def __repr__(self) -> str:
        return f"MemoryBudget(limit_bytes={self.limit_bytes}, device={self.device!r}, used={self._used})"
