"""Stopping a run on SIGTERM or Ctrl-C, and ranks that never outlive their launcher.

- ``deferred_stop()``: while a training loop runs, SIGTERM and SIGINT are recorded instead of killing the
  process. Every rank's ``StopRequest.votes()`` ride on the all-reduce of the step's loss that the
  Trainer makes anyway (``Trainer.train_step(data, stop=...)``: no collective of their own), so all
  ranks read the same ``agreed_signal`` and stop after the same step: the loop saves a checkpoint and
  raises ``RunInterrupted``. A second signal at least a second after the first stops at once (a single Ctrl-C under torchrun reaches a rank twice:
  the terminal's SIGINT and torchrun's SIGTERM, a moment apart).
- ``die_with_launcher(pid)``: in a spawned rank, the kernel kills it when its parent dies
  (``PR_SET_PDEATHSIG`` on Linux), and a watchdog thread kills its process group when the launcher has
  exited (every platform). The watchdog is what works under the forkserver start method: there the
  parent is the fork server, which lives as long as any child it forked does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1
ESCALATE_AFTER = 1.0  # seconds between two signals for the second to stop at once


class RunInterrupted(RuntimeError):
    """The run was stopped by a signal (SIGTERM, or SIGINT from Ctrl-C); the message says what was saved."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message, signum)
        self.message, self.signum = message, signum

    def __str__(self) -> str:
        return self.message

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process ended by that signal."""
        return 128 + self.signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequest:
    """The first stop signal received while installed (None: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._at = 0.0
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and time.monotonic() - self._at >= ESCALATE_AFTER:
            self.restore()
            raise KeyboardInterrupt(f"second {signal_name(signum)}: stopping at once")
        if self.signum is None:
            self.signum, self._at = signum, time.monotonic()

    def install(self) -> bool:
        """Take over SIGTERM and SIGINT (main thread only; elsewhere: False, nothing changed)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def votes(self) -> list[float]:
        """This rank's vote per ``STOP_SIGNALS`` entry (1.0 for the signal received, else 0.0): summed over
        the ranks, in any all-reduce SUM the ranks already make, ``agreed_signal`` reads the outcome."""
        return [1.0 if self.signum == signum else 0.0 for signum in STOP_SIGNALS]


def agreed_signal(summed_votes) -> int | None:
    """The stop signal some rank voted for (the highest-numbered one when ranks got different signals,
    the answer a MAX all-reduce of the signal numbers would give); None when no rank has one."""
    voted = [signum for signum, count in zip(STOP_SIGNALS, summed_votes, strict=True) if count > 0]
    return max(voted) if voted else None


@contextlib.contextmanager
def deferred_stop():
    """Record SIGTERM/SIGINT in the yielded ``StopRequest`` instead of dying, for the block."""
    stop = StopRequest()
    stop.install()
    try:
        yield stop
    finally:
        stop.restore()


def _set_parent_death_signal(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watchdog alone
        pass


def _watch(launcher_pid: int, interval: float) -> None:
    while _alive(launcher_pid):
        time.sleep(interval)
    _kill_own_group()


def _alive(pid: int) -> bool:
    """False once ``pid`` has exited, including as a zombie its own parent has not reaped yet (which
    ``kill(pid, 0)`` still finds: a launcher killed inside a test runner stays one until it is waited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid now belongs to another user's process: the launcher is gone
        return False
    return True


def _kill_own_group() -> None:
    try:
        if os.getpgid(0) == os.getpid():  # we lead our group (spawn put us there): take it all down
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_launcher(launcher_pid: int, *, interval: float = 0.5) -> None:
    """Make this process die when its parent or ``launcher_pid`` does (see the module docstring)."""
    _set_parent_death_signal(signal.SIGKILL)
    threading.Thread(target=_watch, args=(launcher_pid, interval), name="launcher-watchdog", daemon=True).start()
