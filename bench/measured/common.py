"""What every measured worker shares: the timed step loop and the process's peak memory.

Memory on CPU: every system is measured by the same yardstick, the growth of the process's peak
resident set (``ru_maxrss``) over its resident set when the worker started (torch imported, no model
built), the most over the system's processes. Round-robin also reports its executor's own device
accounting (``MemoryBudget.peak``), which counts only what it places on a device.

Load from other processes: each timed step also records the run-queue wait of this process's threads
(``/proc/self/task/*/schedstat``, second field: nanoseconds a thread was runnable but another had the
core), the most of any one thread alive at the step's end (``wait_s``: the pool's device threads, started
and ended within each step, are not seen, so its wait is undercounted), and the process's CPU time
(``cpu_s``, ``getrusage``: every thread, ended ones too). On a shared
machine the wait is time the step lost to whatever else ran, which no cost model prices; the calibration
(bench/measured/calibration.py) reports the step with and without it.
"""

from __future__ import annotations

import os
import resource
import time

import torch
import torch.distributed as dist


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def thread_schedstats() -> dict[str, tuple[int, int]]:
    """Thread id -> (CPU ns, run-queue wait ns) for every thread of this process; {} where Linux's
    schedstat is not there."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        out[tid] = (int(cpu), int(wait))
    return out


def schedstat_delta(before: dict, after: dict) -> tuple[float, float]:
    """(CPU seconds of all threads, the longest run-queue wait of one thread, seconds) between two
    ``thread_schedstats``; a thread born meanwhile counts from zero."""
    deltas = [(c - before.get(t, (0, 0))[0], w - before.get(t, (0, 0))[1]) for t, (c, w) in after.items()]
    return sum(c for c, _ in deltas) / 1e9, max((w for _, w in deltas), default=0) / 1e9


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def timed_steps(step, *, steps: int, warmup: int) -> dict:
    """Run ``step(i)`` for ``warmup + steps`` steps between barriers; losses of every step, and of the timed
    ones the wall time, this process's CPU time and its longest thread's run-queue wait (module docstring)."""
    losses, times, cpu, wait = [], [], [], []
    for i in range(warmup + steps):
        barrier()
        before, cpu_before = thread_schedstats(), _process_cpu_s()
        start = time.perf_counter()
        loss = step(i)
        barrier()
        elapsed = time.perf_counter() - start
        wait_s = schedstat_delta(before, thread_schedstats())[1]
        cpu_s = _process_cpu_s() - cpu_before
        losses.append(loss)
        if i >= warmup:
            times.append(elapsed)
            cpu.append(cpu_s)
            wait.append(wait_s)
    return {"losses": losses, "times": times, "cpu_s": cpu, "wait_s": wait}


def all_reduce_sum(value: float) -> float:
    """The sum of ``value`` over the ranks (data-parallel systems' loss: each rank holds its share)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def data_parallel_slices(x, y, *, rank: int, world: int, microbatches: int):
    """This rank's share of the global batch, cut into its micro-batches (``microbatches / world`` of them)."""
    local = x.shape[0] // world
    xs, ys = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
    k = microbatches // world
    return list(zip(xs.chunk(k), ys.chunk(k), strict=True))
