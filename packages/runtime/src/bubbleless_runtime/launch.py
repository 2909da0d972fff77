"""Starting the ranks: under ``torchrun`` (environment variables), or N local processes spawned here.

- ``init_from_env()``: what a script run by ``torchrun`` calls (also across machines, unchanged). It
  reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, picks NCCL/RCCL when a GPU is
  present and gloo otherwise, and initialises the default process group.
- ``spawn(fn, nproc, *args)``: starts ``nproc`` local processes on gloo (what ``bubbleless train --nproc``
  uses), calls ``fn(rank, *args)`` in each, and returns the per-rank results. A child's exception is
  raised again in the parent, same type, with the child's traceback attached as its cause; a child that
  dies without a report (killed, ``os._exit``) becomes a ``RuntimeError`` naming the rank and exit code.
- ``run(fn, nproc, *args)``: ``fn(rank, *args)`` in this process when launched by torchrun, else ``spawn``.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_PG_TIMEOUT = 600.0


class RemoteTraceback(Exception):
    """Carries a child process's formatted traceback as the cause of the re-raised exception."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


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


def _child(rank, nproc, port, backend, threads, pg_timeout, fn, args, reports) -> None:
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
        try:
            reports.put((rank, "error", exc, text))
        except Exception:  # the exception itself does not pickle: send its text
            reports.put((rank, "error", RuntimeError(f"{type(exc).__name__}: {exc}"), text))
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
    grace: float = 30.0,
    pg_timeout: float = DEFAULT_PG_TIMEOUT,
    start_method: str = "forkserver",
) -> list:
    """Run ``fn(rank, *args)`` in ``nproc`` fresh local processes joined in one process group.

    ``fn`` must be importable (a module-level function). ``threads_per_process``: torch threads per
    child (default: the CPU count shared evenly). ``timeout``: seconds for the whole run (None: no limit).
    ``grace``: after a child fails, how long the others get to report their own errors before they are
    terminated. ``start_method``: "forkserver" (default) imports torch once in a server process that
    later spawns fork from, which makes repeated spawns cheap; "spawn" starts each child from scratch.
    Returns the results in rank order.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    threads = threads_per_process or max(1, (os.cpu_count() or 1) // nproc)
    ctx = _context(start_method)
    reports = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_child, args=(r, nproc, port, backend, threads, pg_timeout, fn, args, reports), daemon=True)
        for r in range(nproc)
    ]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    failures: list[tuple[int, BaseException | None, str]] = []
    started, failed_at = time.monotonic(), None
    try:
        while len(results) + len(failures) < nproc:
            now = time.monotonic()
            if failed_at is not None and now - failed_at > grace:
                break
            if timeout is not None and now - started > timeout:
                failures.append((-1, None, f"spawn: the run exceeded timeout={timeout:g}s"))
                break
            try:
                rank, status, payload, text = reports.get(timeout=0.1)
            except queue_mod.Empty:
                _note_silent_exits(procs, results, failures)
            else:
                if status == "ok":
                    results[rank] = payload
                else:
                    failures.append((rank, payload, text))
            if failures and failed_at is None:
                failed_at = time.monotonic()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
    if failures:
        _raise_first(failures, nproc)
    return [results[r] for r in range(nproc)]


def _context(start_method: str):
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed", "bubbleless_runtime"])
    return ctx


def _note_silent_exits(procs, results, failures) -> None:
    reported = set(results) | {r for r, _, _ in failures}
    for rank, p in enumerate(procs):
        if rank not in reported and not p.is_alive() and p.exitcode is not None:
            time.sleep(0.2)  # a report may still be in flight through the queue
            failures.append((rank, None, f"rank {rank} exited with code {p.exitcode} without reporting a result"))


def _raise_first(failures, nproc: int):
    rank, exc, text = failures[0]
    others = ", ".join(f"rank {r}" for r, _, _ in failures[1:] if r >= 0)
    if exc is None:
        raise RuntimeError(text + (f" (also failed: {others})" if others else ""))
    exc.__cause__ = RemoteTraceback(f"\n--- rank {rank} of {nproc}, traceback in the child ---\n{text}")
    if others:
        exc.add_note(f"(raised in rank {rank}; also failed: {others})")
    else:
        exc.add_note(f"(raised in rank {rank})")
    raise exc


def run(fn, nproc: int, *args, **spawn_options):
    """Under torchrun: init from the environment and return ``fn(rank, *args)``; else ``spawn`` ``nproc``."""
    if under_torchrun():
        return fn(init_from_env(), *args)
    return spawn(fn, nproc, *args, **spawn_options)
