"""Which rank's failure is the root cause, and the one error that says so (for ``launch.spawn``).

When one rank fails the others fail soon after, for a consequence: a peer that raised, died or stalled
makes every survivor's transfer fail (``PipelineCommError``). Reports reach the launcher in any order,
so the launcher collects them for a short grace period and ranks them, root causes first:

1. a rank's own exception (a ``loss_fn`` returning a non-scalar, a ``ValueError``, ``RunInterrupted``);
2. a rank that died without reporting (a signal, ``os._exit``, the out-of-memory killer);
3. a rank still alive that never reported while others failed: stalled (SIGSTOP, a GPU hang, a deadlock);
4. communication errors of survivors; 5. the whole run's timeout.

A root cause that is an exception is raised again with its type, the child's traceback as its cause and
a note naming the rank and the consequences; any other becomes ``RankFailure``. A ``ValueError`` stays one
(the user's input is wrong: ``bubbleless train`` prints its message alone, once, and exits with code 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from .signals import signal_name

OWN, DEATH, STALL, COMM, TIMEOUT = range(5)
_KIND_WORDS = {OWN: "raised", DEATH: "died", STALL: "stalled", COMM: "lost contact", TIMEOUT: "timed out"}
_PROCESS_STATES = {"T": "stopped (SIGSTOP or a debugger)", "t": "stopped by a tracer", "D": "in uninterruptible I/O",
                   "S": "sleeping (waiting, e.g. in a deadlocked collective)", "R": "running (busy, e.g. a hung loop)",
                   "Z": "a zombie"}


# what torch.distributed's errors say when a peer is gone or silent (gloo's source paths, NCCL's words)
_COMM_MARKERS = ("gloo/", "Gloo", "Timed out waiting", "Connection closed by peer", "Connection reset by peer",
                 "Broken pipe", "NCCL error", "ProcessGroupNCCL", "Watchdog caught collective operation timeout")


class RankFailure(RuntimeError):
    """A rank died, stalled or timed out without an exception of its own (see ``rank_failures``)."""


class RemoteTraceback(Exception):
    """Carries a child process's formatted traceback as the cause of the re-raised exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


@dataclass
class Failure:
    """One rank's failure as the launcher saw it (``rank`` -1: the run as a whole)."""

    rank: int
    kind: int
    text: str
    exc: BaseException | None = None

    def summary(self) -> str:
        if self.exc is not None:
            return f"rank {self.rank} ({type(self.exc).__name__}: {_first_line(self.exc)})"
        return f"rank {self.rank} ({_KIND_WORDS[self.kind]})" if self.rank >= 0 else self.text


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0][:160] if text else "").rstrip()


def is_comm_error(exc: BaseException) -> bool:
    """A consequence of a peer's failure rather than a cause: a failed transfer or collective."""
    from .comm import PipelineCommError

    if isinstance(exc, PipelineCommError):
        return True
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(exc)  # a blocking collective (barrier, all_gather_object) raises a plain RuntimeError
    return isinstance(exc, RuntimeError) and any(marker in text for marker in _COMM_MARKERS)


def reported(rank: int, exc: BaseException, text: str) -> Failure:
    return Failure(rank, COMM if is_comm_error(exc) else OWN, text, exc)


def died(rank: int, exitcode: int) -> Failure:
    if exitcode < 0:
        how = f"was killed by {signal_name(-exitcode)}"
    else:
        how = f"exited with code {exitcode}"
    return Failure(rank, DEATH, f"rank {rank} {how} without reporting a result")


def stalled(rank: int, pid: int | None) -> Failure:
    state = process_state(pid)
    where = f", process state: {_PROCESS_STATES.get(state, state)}" if state else ""
    return Failure(rank, STALL, f"rank {rank} stopped responding: alive but no result while the others failed{where}; "
                                "it was killed")


def process_state(pid: int | None) -> str | None:
    """The one-letter state of ``pid`` from /proc (Linux), None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def root_cause(failures: list[Failure]) -> Failure:
    """The failure to headline: the most causal kind, then the lowest rank."""
    return min(failures, key=lambda f: (f.kind, f.rank if f.rank >= 0 else 1 << 30))


def raise_root_cause(failures: list[Failure], nproc: int):
    """Raise the root cause of ``failures`` (see the module docstring)."""
    cause = root_cause(failures)
    others = [f for f in failures if f is not cause and f.rank >= 0]
    consequences = "; then " + ", ".join(f.summary() for f in sorted(others, key=lambda f: f.rank)) if others else ""
    if cause.exc is None:
        raise RankFailure(f"{cause.text} (of {nproc} ranks){consequences}" if cause.rank >= 0
                          else cause.text + consequences)
    exc = cause.exc
    exc.__cause__ = RemoteTraceback(f"\n--- rank {cause.rank} of {nproc}, traceback in the child ---\n{cause.text}")
    if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the __cause__ above names the rank
        exc.add_note(f"(raised in rank {cause.rank} of {nproc}{consequences})")
    raise exc
