"""What every measured worker shares: the timed step loop and the process's peak memory.

Memory on CPU: every system is measured by the same yardstick, the growth of the process's peak
resident set (``ru_maxrss``) over its resident set when the worker started (torch imported, no model
built), the most over the system's processes. Round-robin also reports its executor's own device
accounting (``MemoryBudget.peak``), which counts only what it places on a device.
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


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def timed_steps(step, *, steps: int, warmup: int) -> dict:
    """Run ``step(i)`` for ``warmup + steps`` steps between barriers; losses of every step, times of the timed."""
    losses, times = [], []
    for i in range(warmup + steps):
        barrier()
        start = time.perf_counter()
        loss = step(i)
        barrier()
        elapsed = time.perf_counter() - start
        losses.append(loss)
        if i >= warmup:
            times.append(elapsed)
    return {"losses": losses, "times": times}


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
