"""Starting the ranks: under ``torchrun`` (environment variables), or N local processes spawned here.

- ``init_from_env()``: what a script run by ``torchrun`` calls (also across machines, unchanged). It
  reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, picks NCCL/RCCL when a GPU is
  present and gloo otherwise, and initialises the default process group.
- ``spawn(fn, nproc, *args)``: starts ``nproc`` local processes on gloo (what ``bubbleless train --nproc``
  uses), calls ``fn(rank, *args)`` in each, and returns the per-rank results. A child's exception is
  raised again in the parent, same type (one that does not pickle: a ``RuntimeError`` with its text, a
  ``ValueError`` staying a ``ValueError``), with the child's traceback attached as its cause; a child that
  dies without a report (killed, ``os._exit``) or stalls becomes a ``RankFailure`` naming the rank and
  how (signal, exit code, process state). Of several failures the root cause is raised, never a
  survivor's ``PipelineCommError`` (``rank_failures``). No child outlives the call or the launcher.
- ``run(fn, nproc, *args)``: ``fn(rank, *args)`` in this process when launched by torchrun, else ``spawn``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue as queue_mod
import signal
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .rank_failures import (
    OWN,
    TIMEOUT,
    Failure,
    RankFailure,
    RemoteTraceback,
    died,
    process_state,
    raise_root_cause,
    reported,
    stalled,
)
from .signals import RunInterrupted, StopRequest, die_with_launcher, signal_name

DEFAULT_PG_TIMEOUT = 600.0

__all__ = ["RankFailure", "RemoteTraceback", "RunInterrupted", "init_from_env", "run", "spawn", "under_torchrun"]


def under_torchrun() -> bool:
    """True when this process was started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(*, backend: str | None = None, timeout: float = DEFAULT_PG_TIMEOUT) -> int:
    """Initialise the default process group from torchrun's environment; returns the global rank."""
    if not under_torchrun():
        raise ValueError("RANK and WORLD_SIZE are not set: start this script with torchrun, or use spawn()")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    return rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank, nproc, port, backend, threads, pg_timeout, fn, args, reports, launcher_pid) -> None:
    os.setpgid(0, 0)  # a group of its own: Ctrl-C reaches the launcher only, and cleanup takes grandchildren too
    die_with_launcher(launcher_pid)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    if threads:
        torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, rank=rank, world_size=nproc, timeout=timedelta(seconds=pg_timeout))
        result = fn(rank, *args)
        reports.put((rank, "ok", result, ""))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        text = traceback.format_exc()
        try:  # the queue pickles in a feeder thread, where a failure would be lost: check here
            pickle.loads(pickle.dumps(exc))
        except Exception:  # noqa: BLE001 - the exception itself does not round-trip: send its text
            # a ValueError stays one (the user's input is wrong: ``bubbleless train`` prints its message only)
            exc = ValueError(str(exc)) if isinstance(exc, ValueError) else RuntimeError(f"{type(exc).__name__}: {exc}")
        reports.put((rank, "error", exc, text))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn,
    nproc: int,
    *args,
    backend: str = "gloo",
    threads_per_process: int | None = None,
    timeout: float | None = None,
    grace: float = 5.0,
    pg_timeout: float = DEFAULT_PG_TIMEOUT,
    start_method: str = "forkserver",
    stop_grace: float = 120.0,
) -> list:
    """Run ``fn(rank, *args)`` in ``nproc`` fresh local processes joined in one process group.

    ``fn`` must be importable (a module-level function). ``threads_per_process``: torch threads per
    child (default: the CPU count shared evenly). ``timeout``: seconds for the whole run (None: no limit).
    ``grace``: after a child fails, how long the others get to report their own errors before they are
    killed; the error raised is then the root cause (``rank_failures``), not whichever report came first.
    ``pg_timeout``: the process group's timeout (its blocking collectives). ``start_method``:
    "forkserver" (default) imports torch once in a server process that later spawns fork from, which
    makes repeated spawns cheap; "spawn" starts each child from scratch.

    No child outlives this call or this process: each runs in a process group of its own and dies with
    the launcher (``signals.die_with_launcher``); on return or error every group still alive is killed.
    SIGTERM or Ctrl-C (SIGINT) here is passed on to the children as SIGTERM; children that stop for it
    (``bubbleless train`` saves a checkpoint first) get ``stop_grace`` seconds, then are killed, and
    ``RunInterrupted`` is raised. Returns the results in rank order.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    threads = threads_per_process or max(1, (os.cpu_count() or 1) // nproc)
    ctx = _context(start_method)
    reports = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_child, args=(r, nproc, port, backend, threads, pg_timeout, fn, args, reports, os.getpid()),
                    daemon=True)
        for r in range(nproc)
    ]
    stop = StopRequest()
    stop.install()
    try:
        for p in procs:
            p.start()
        results, failures = _collect(procs, reports, stop, timeout=timeout, grace=grace, stop_grace=stop_grace)
    finally:
        stop.restore()
        _reap(procs)
    if stop.signum is not None and not any(f.kind == OWN for f in failures):
        raise RunInterrupted(f"stopped by {signal_name(stop.signum)}: the ranks were stopped", stop.signum)
    if failures:
        raise_root_cause(failures, nproc)
    return [results[r] for r in range(nproc)]


def _collect(procs, reports, stop: StopRequest, *, timeout, grace, stop_grace) -> tuple[dict, list[Failure]]:
    """Read the children's reports until every rank is accounted for, or a deadline passes."""
    nproc = len(procs)
    results: dict[int, object] = {}
    errors: dict[int, Failure] = {}  # rank -> its report, or how it died
    started, failed_at, stop_at = time.monotonic(), None, None
    while len(results) + len(errors) < nproc:
        now = time.monotonic()
        if stop.signum is not None and stop_at is None:
            stop_at = now
            _signal_all(procs, signal.SIGTERM)
        if stop_at is not None and now - stop_at > stop_grace:
            break
        if failed_at is not None and stop_at is None and (now - failed_at > grace or _only_stopped_left(procs, results, errors)):
            break
        if timeout is not None and now - started > timeout:
            errors[-1] = Failure(-1, TIMEOUT, f"spawn: the run exceeded timeout={timeout:g}s")
            break
        try:
            rank, status, payload, text = reports.get(timeout=0.1)
        except queue_mod.Empty:
            _note_silent_exits(procs, results, errors)
        else:
            if status == "ok":
                results[rank] = payload
            else:
                errors[rank] = reported(rank, payload, text)  # a report replaces a death noted before it
        if errors and failed_at is None:
            failed_at = time.monotonic()
    _drain(reports, results, errors)
    if errors or stop_at is not None:
        for rank, p in enumerate(procs):
            if rank not in results and rank not in errors:
                if p.is_alive():
                    errors[rank] = stalled(rank, p.pid)
                elif p.exitcode is not None:
                    errors[rank] = died(rank, p.exitcode)
    return results, list(errors.values())


def _only_stopped_left(procs, results, errors) -> bool:
    """Every rank not yet accounted for is stopped (SIGSTOP): none of them can report, stop waiting."""
    waiting = [p for rank, p in enumerate(procs) if rank not in results and rank not in errors]
    return bool(waiting) and all(process_state(p.pid) in ("T", "t") for p in waiting)


def _drain(reports, results, errors) -> None:
    """Reports already in the queue (a rank reporting while the loop gave up on it)."""
    while True:
        try:
            rank, status, payload, text = reports.get_nowait()
        except (queue_mod.Empty, OSError, ValueError):
            return
        if status == "ok":
            results[rank] = payload
        else:
            errors[rank] = reported(rank, payload, text)


def _signal_all(procs, signum: int) -> None:
    for p in procs:
        if p.pid is not None and p.exitcode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signum)


def _reap(procs, wait: float = 2.0) -> None:
    """End every child and its process group: a short wait for those finishing, then SIGKILL (which
    also ends a stopped process, where SIGTERM would wait for a SIGCONT that never comes)."""
    deadline = time.monotonic() + wait
    for p in procs:
        if p.pid is not None and process_state(p.pid) not in ("T", "t"):  # a stopped one never finishes
            p.join(timeout=max(deadline - time.monotonic(), 0.0))
    for p in procs:
        if p.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # the group: the child and anything it started
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if p.exitcode is None:
                    os.kill(p.pid, signal.SIGKILL)
    for p in procs:
        if p.pid is not None:
            p.join(timeout=10)


def _context(start_method: str):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "bubbleless_runtime"])
    return ctx


def _note_silent_exits(procs, results, errors) -> None:
    for rank, p in enumerate(procs):
        if rank not in results and rank not in errors and not p.is_alive() and p.exitcode is not None:
            time.sleep(0.2)  # a report may still be in flight through the queue
            errors[rank] = died(rank, p.exitcode)


def run(fn, nproc: int, *args, **spawn_options):
    """Under torchrun: init from the environment and return ``fn(rank, *args)``; else ``spawn`` ``nproc``."""
    if under_torchrun():
        return fn(init_from_env(), *args)
    return spawn(fn, nproc, *args, **spawn_options)
