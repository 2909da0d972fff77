"""Where a system's memory goes, per rank: ``python -m bench.measured.memory --seq-len 2048 [--systems ...]``.

For each system a warm-up step and a step (in fresh processes, as a longest-sequence probe runs it:
``probe_scenario``, ``PROBE_WARMUP``, ``PROBE_STEPS``)
with three yardsticks per rank, all measured, none modelled:

- ``peak_rss_growth``: ``ru_maxrss`` over the resident set when the worker started (the measured
  report's yardstick, which sees whatever the allocator keeps);
- ``malloc_peak_growth``: the most bytes glibc had handed out at once (``mallinfo2``: ``uordblks`` +
  ``hblkhd``, sampled every millisecond by a thread, and at every saved tensor), over the start: what
  the process held, without the pages the allocator kept after a free;
- ``saved_peak``: the most bytes of tensors saved for backward alive at once
  (``bubbleless_runtime.saved_bytes``: autograd's hooks, each storage once, until the storage dies), so
  what a deferred weight gradient keeps after I is counted too.

The difference between the first two is the allocator's; between the last two, what is not a saved
activation (weights, gradients, optimizer state, transfer buffers, logits, temporaries).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

from bench.strict_json import dumps

from .common import peak_rss_bytes, rss_bytes
from .runner import PROBE_STEPS, PROBE_WARMUP, _runner, probe_scenario
from .scenario import scenario_from_dict


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO = _mallinfo()


def malloc_in_use() -> int:
    """Bytes glibc has handed out and not had back (heap chunks in use plus mmapped chunks); 0 elsewhere."""
    if _MALLINFO is None:
        return 0
    info = _MALLINFO()
    return int(info.uordblks + info.hblkhd)


class MallocPeak:
    """The most ``malloc_in_use`` seen, sampled by a daemon thread every ``period`` seconds."""

    def __init__(self, period: float = 0.001) -> None:
        self.start = self.peak = malloc_in_use()
        self.period, self.stopped = period, False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        self.peak = max(self.peak, malloc_in_use())

    def _loop(self) -> None:
        while not self.stopped:
            self.sample()
            time.sleep(self.period)

    def stop(self) -> int:
        self.stopped = True
        self.thread.join()
        self.sample()
        return self.peak - self.start


def traced_interpreter(saved, sampler: MallocPeak, trace: list):
    """Our executor's table with every compute handler wrapped: after each, (action, saved bytes, malloc)."""
    from bubbleless_runtime.executor import INTERPRETER
    from bubbleless_schedules.action import COMPUTE_KINDS

    table = INTERPRETER
    for kind, handler in INTERPRETER.handlers.items():
        if kind in COMPUTE_KINDS:
            def wrapped(backend, action, state, handler=handler):
                out = handler(backend, action, state)
                sampler.sample()
                trace.append((str(action), saved.live, malloc_in_use() - sampler.start))
                return out
            table = table.with_handler(kind, wrapped)
    return table


def worker(rank: int, system: str, scenario: dict, seq_len: int) -> dict:
    from bubbleless_runtime.saved_bytes import SavedBytes

    from . import ours

    start = rss_bytes()
    sampler, trace = MallocPeak(), []
    saved = SavedBytes(on_save=sampler.sample)
    run, extra = _runner(system), {}
    if run is ours.stage_bound:
        extra["interpreter"] = traced_interpreter(saved, sampler, trace)
    with saved:
        run(rank, scenario_from_dict(scenario), system=system, steps=PROBE_STEPS, warmup=PROBE_WARMUP,
            seq_len=seq_len, **extra)
    return {"rank": rank, "peak_rss_growth": max(0, peak_rss_bytes() - start), "malloc_peak_growth": sampler.stop(),
            "saved_peak": saved.peak, "actions": trace}


def measure(scenario, system: str, seq_len: int) -> list[dict]:
    from bubbleless_runtime import spawn

    probe = probe_scenario(scenario)
    return spawn(worker, probe.workers, system, probe.as_dict(), seq_len, threads_per_process=probe.threads,
                 timeout=scenario.timeout_s)


def simulated_peaks(system: str, scenario) -> tuple[float, ...] | None:
    """The schedule's activation peak per rank (``bubbleless_schedules.peak_memory``, in M_B: one
    micro-batch's activations of a rank's share; I frees nothing, W frees it) at the probe's shape."""
    from bubbleless_schedules import generate, peak_memory

    from .ours import SCHEDULE_OF

    name = "1f1b" if system == "1f1b" else SCHEDULE_OF.get(system)
    if name is None:
        return None
    probe = probe_scenario(scenario)
    return tuple(peak_memory(generate(name, num_ranks=probe.workers, num_microbatches=probe.microbatches)))


def breakdown(scenario, seq_len: int, systems=("zbv", "bubbleless-1f1b", "1f1b")) -> dict:
    """Per system: every rank's three peaks (``worker``) and the schedule's simulated peaks."""
    out = {}
    for system in systems:
        ranks = measure(scenario, system, seq_len)
        for r in ranks:
            r.pop("actions")
        out[system] = {"ranks": ranks, "simulated_peak": simulated_peaks(system, scenario)}
    return {"seq_len": seq_len, "microbatches": probe_scenario(scenario).microbatches, "systems": out}


def section(found: dict) -> list[str]:
    """The measured record's per-rank memory table (``report.write``)."""
    seq, m = found["seq_len"], found["microbatches"]
    lines = [
        f"## Memory per rank at {seq:,} tokens", "",
        f"A warm-up step and a step of {m} micro-batches of {seq:,} tokens (a longest-sequence probe), fresh processes, "
        "by `bench/measured/memory.py`: saved for backward = the most bytes of tensors autograd saved alive at "
        "once (`bubbleless_runtime.saved_bytes`, each storage once, until it dies: what a deferred W keeps "
        "counts); malloc = the most bytes glibc had handed out (`mallinfo2`, sampled every millisecond); RSS = "
        "the peak resident set's growth (the table above's yardstick, which also sees the pages glibc keeps "
        "after a free). Simulated = the schedule's peak in M_B (one micro-batch of a rank's share; I frees "
        "nothing, W frees it).", "",
        "| system | rank | simulated peak (M_B) | saved for backward (MiB) | malloc peak growth (MiB) | "
        "RSS growth (MiB) |", "|---|---|---|---|---|---|"]
    for system, row in found["systems"].items():
        sim = row["simulated_peak"]
        for r in row["ranks"]:
            simulated = "-" if sim is None else f"{sim[r['rank']]:g}"
            lines.append(f"| {system} | {r['rank']} | {simulated} | "
                         f"{r['saved_peak'] / 2**20:,.0f} | {r['malloc_peak_growth'] / 2**20:,.0f} | "
                         f"{r['peak_rss_growth'] / 2**20:,.0f} |")
    return lines + [""]


def main(argv=None) -> int:
    from .scenario import load_scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="bench/scenarios/tiny.yaml")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--systems", default="zbv,bubbleless-1f1b,1f1b")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--per-action", action="store_true", help="our executors: live bytes after each compute")
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    out = {}
    for system in args.systems.split(","):
        out[system] = measure(scenario, system, args.seq_len)
        if not args.json:
            for r in out[system]:
                print(f"{system:16s} rank {r['rank']}: rss growth {r['peak_rss_growth'] / 2**20:7.1f} MiB, "
                      f"malloc peak growth {r['malloc_peak_growth'] / 2**20:7.1f} MiB, "
                      f"saved for backward peak {r['saved_peak'] / 2**20:7.1f} MiB", flush=True)
                if args.per_action:
                    print("   " + ", ".join(f"{a} {b / 2**20:.0f}/{c / 2**20:.0f}" for a, b, c in r["actions"]))
    if args.json:
        print(dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
