"""Processes of a run, found through /proc (Linux): a launcher's ranks, and anything left behind.
Shared by the runtime's process tests and ``bench/reliability/faults.py``.

Every process a test or fault run starts inherits ``BUBBLELESS_TEST_MARKER=<run id>`` (``MARKER``) in its
environment, so ``marked(run)`` finds its leftovers wherever they were reparented. Ranks of ``bubbleless train`` are
the children of the launcher's fork server (``launch.spawn`` uses the forkserver start method), forked
in rank order, so their pids sorted are the ranks in order.
"""

from __future__ import annotations

import os
import signal

MARKER = "BUBBLELESS_TEST_MARKER"


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """False once ``pid`` has exited, as a zombie its parent has not reaped yet too."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``, sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def ranks_of(launcher: int) -> list[int]:
    """Rank pids under ``launcher``, rank 0 first."""
    ranks = []
    for child in children(launcher):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"forkserver" in f.read():
                    ranks += children(child)
        except OSError:
            continue
    return sorted(p for p in ranks if alive(p))


def marked(run: str) -> list[int]:
    """Live processes started for ``run`` (its marker in their environment)."""
    needle = f"{MARKER}={run}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_all(pids) -> None:
    """SIGKILL each of ``pids`` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
