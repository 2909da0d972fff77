"""What every measured worker shares: the timed step loop and the process's peak memory.

Memory on CPU: every system is measured by the same yardstick, the growth of the process's peak
resident set (``ru_maxrss``) over its resident set when the worker started (torch imported, no model
built), the most over the system's processes. Round-robin also reports its executor's own device
accounting (``MemoryBudget.peak``), which counts only what it places on a device.

Load from other processes: each timed step also records the run-queue wait of this process's threads
(``/proc/self/task/*/schedstat``, second field: nanoseconds a thread was runnable but another had the
core), the most of any one thread over the step (``wait_s``), and the process's CPU time (``cpu_s``,
``getrusage``: every thread, ended ones too). A thread that starts and ends within a step (the round-robin
pool's device threads, started afresh each step) is gone from ``/proc`` when the step ends, so a watcher
thread (``ThreadWatch``) reads every thread's schedstat each ``WATCH_PERIOD_S`` and keeps the last reading
of each: such a thread counts up to its last reading, at most one period short. On a shared
machine the wait is time the step lost to whatever else ran, which no cost model prices; the calibration
(bench/measured/calibration.py) reports the step with and without it.
"""

from __future__ import annotations

import math
import os
import resource
import threading
import time

import torch
import torch.distributed as dist


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def thread_schedstats() -> dict[tuple[str, int], tuple[int, int]]:
    """(thread id, its start time) -> (CPU ns, run-queue wait ns) for every thread of this process; {}
    where Linux's schedstat is not there. The start time (``/proc/.../stat`` field 22, clock ticks since
    boot) tells a thread from a later one that took its ended id."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
            with open(f"/proc/self/task/{tid}/stat") as f:
                start = int(f.read().rpartition(")")[2].split()[19])  # after the name, which may hold spaces
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        out[(tid, start)] = (int(cpu), int(wait))
    return out


def schedstat_delta(before: dict, after: dict) -> tuple[float, float]:
    """(CPU seconds of all threads, the longest run-queue wait of one thread, seconds) between two
    ``thread_schedstats``; a thread born meanwhile counts from zero, as does one whose counters went back
    (an ended thread's id taken by a new one within the same clock tick of the start time)."""
    deltas = [_since(before.get(t, (0, 0)), now) for t, now in after.items()]
    return sum(c for c, _ in deltas) / 1e9, max((w for _, w in deltas), default=0) / 1e9


WATCH_PERIOD_S = 0.02
"""How often ``ThreadWatch`` reads the threads' schedstat: a thread that ends within a step is seen up to
this much short of its end (a lower bound on its wait); each reading costs about 0.1 ms of CPU (a few
small /proc reads), 0.5% of a core."""


class ThreadWatch:
    """Every thread's last schedstat reading since ``restart`` (the module docstring): ``with
    ThreadWatch() as watch: watch.restart(); ...; watch.readings()``.

    The watcher reads /proc outside the lock; a reading taken before a ``restart`` and recorded after it
    would put a thread that ended before the restart back into the new step, counted from zero: its whole
    life's CPU and wait. So each reading carries the generation it was taken under (``restart`` bumps it)
    and one from an older generation is dropped."""

    def __init__(self, period_s: float = WATCH_PERIOD_S) -> None:
        if isinstance(period_s, bool) or not isinstance(period_s, (int, float)) or not 0 < period_s < math.inf:
            raise ValueError(f"ThreadWatch period_s must be a finite positive number of seconds (e.g. "
                             f"{WATCH_PERIOD_S}), got {period_s!r}")
        self.period_s = period_s
        self.polls = 0
        """Readings the watcher thread has recorded or dropped (tests wait on it)."""
        self._seen: dict[tuple[str, int], tuple[int, int]] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="bench-thread-watch", daemon=True)

    def __enter__(self) -> ThreadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            generation = self._generation
            self._record(thread_schedstats(), generation)
            self.polls += 1

    def _record(self, now: dict, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._seen.update(now)

    def restart(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Forget ended threads; the threads alive now with their readings (a step's ``before``)."""
        now = thread_schedstats()
        with self._lock:  # a reading the watcher took before this one is of the old step from here on
            self._generation += 1
            self._seen = dict(now)
        return now

    def readings(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Every thread seen since ``restart``: alive ones read now, ended ones at their last reading."""
        generation = self._generation
        self._record(thread_schedstats(), generation)
        with self._lock:
            return dict(self._seen)


def _process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _since(then: tuple[int, int], now: tuple[int, int]) -> tuple[int, int]:
    return now if now[0] < then[0] or now[1] < then[1] else (now[0] - then[0], now[1] - then[1])


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def timed_steps(step, *, steps: int, warmup: int) -> dict:
    """Run ``step(i)`` for ``warmup + steps`` steps between barriers; losses of every step, and of the timed
    ones the wall time, this process's CPU time and its longest thread's run-queue wait (module docstring)."""
    losses, times, cpu, wait = [], [], [], []
    with ThreadWatch() as watch:
        for i in range(warmup + steps):
            barrier()
            before, cpu_before = watch.restart(), _process_cpu_s()
            start = time.perf_counter()
            loss = step(i)
            barrier()
            elapsed = time.perf_counter() - start
            wait_s = schedstat_delta(before, watch.readings())[1]
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
