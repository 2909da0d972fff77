"""Run the systems of a scenario: timed rounds (systems alternating, fresh processes each run) and the
longest sequence under a memory budget (bisection, every probe in fresh processes).

Each run goes through ``bubbleless_runtime.spawn`` (gloo, forkserver): a probe that runs out of memory
or fails kills only its own processes, and the next starts clean.
"""

from __future__ import annotations

import statistics
import time

from .common import peak_rss_bytes, rss_bytes
from .scenario import Scenario, scenario_from_dict


def _runner(system: str):
    from . import baselines, ours

    return {
        "zbv": ours.stage_bound, "zb": ours.stage_bound, "bubbleless-1f1b": ours.stage_bound, "zbv-mem": ours.stage_bound,
        "roundrobin": ours.roundrobin, "1f1b": baselines.torch_1f1b, "ddp": baselines.ddp,
        "fsdp-offload": baselines.fsdp_offload, "zero-infinity": baselines.deepspeed_zero,
        "zero2": baselines.deepspeed_zero, "zero-infinity-nvme": baselines.deepspeed_zero,
    }[system]


def worker(rank: int, system: str, scenario: dict, steps: int, warmup: int, seq_len: int) -> dict:
    """One process of one system's run (module level: ``spawn`` starts it by reference)."""
    start = rss_bytes()
    out = _runner(system)(rank, scenario_from_dict(scenario), system=system, steps=steps, warmup=warmup,
                          seq_len=seq_len)
    out["rss_start_bytes"], out["peak_rss_bytes"] = start, peak_rss_bytes()
    out["peak_growth_bytes"] = max(0, out["peak_rss_bytes"] - start)
    return out


SYSTEM_EXTRAS = ("device_peak_bytes", "optimizer", "plan", "build_s")
"""What some systems' first rank adds to its result (the pool's device accounting, plan and build time; the
optimizer DeepSpeed picked), passed on as it is by a run and by the rounds' summary."""


def processes(scenario: Scenario, system: str) -> tuple[int, int]:
    """(processes, torch threads each): the pool is one process with a thread per device, and each device
    thread takes the process's torch thread count as its own (``pool_worker.run_worker``), so the pool
    process gets ``threads``, what each rank of the other systems gets and the cost model prices per
    device. Measured (tiny scenario, 2 devices, 2026-12-02): given 2 x threads, each device thread ran
    its matmuls on 2 OpenMP threads, and the process spent 1.55-1.68 CPU s a step where its device
    threads' own CPU time was 0.71-0.85 s (the rest on the OpenMP helpers of four threads on two
    cores); given 1, 1.15 s against 1.13 s."""
    if system == "roundrobin":
        return 1, scenario.threads
    return scenario.workers, scenario.threads


def run_system(scenario: Scenario, system: str, *, steps: int, warmup: int, seq_len: int | None = None) -> dict:
    """One run of ``system``: per-step losses (from whichever rank holds them), times (rank 0), peaks."""
    from bubbleless_runtime import spawn

    seq = seq_len or scenario.seq_len
    nproc, threads = processes(scenario, system)
    started = time.perf_counter()
    per_rank = spawn(worker, nproc, system, scenario.as_dict(), steps, warmup, seq, threads_per_process=threads,
                     timeout=scenario.timeout_s)
    losses = [next((r["losses"][i] for r in per_rank if r["losses"][i] is not None), None)
              for i in range(steps + warmup)]
    out = {"losses": losses, "times": per_rank[0]["times"], "seq_len": seq,
           "peak_growth_bytes": max(r["peak_growth_bytes"] for r in per_rank),
           "peak_rss_bytes": max(r["peak_rss_bytes"] for r in per_rank), "processes": nproc,
           "threads": threads, "wall_s": time.perf_counter() - started}
    for key in SYSTEM_EXTRAS:
        if key in per_rank[0]:
            out[key] = per_rank[0][key]
    if all("wait_s" in r for r in per_rank):  # per timed step: the longest wait of any rank, all ranks' CPU
        out["wait_s"] = [max(w) for w in zip(*(r["wait_s"] for r in per_rank), strict=True)]
        out["cpu_s"] = [sum(c) for c in zip(*(r["cpu_s"] for r in per_rank), strict=True)]
    return out


def skip_reason(system: str) -> str:
    """Why ``system`` cannot run on this machine ("" when it can): asked once, before any round, so a
    system that needs what the machine lacks (libaio for NVMe offload) is reported as skipped, not failed."""
    if system == "zero-infinity-nvme":
        from .baselines import aio_unavailable

        return aio_unavailable()
    return ""


def measure(scenario: Scenario, *, progress=None) -> dict[str, dict]:
    """Every system, ``rounds`` times, the order rotated each round; per system the merged figures.

    Each run keeps its round's index (``round``), so that ratios can pair systems round by round."""
    from .vcut import with_measured_cut

    scenario, cut = with_measured_cut(scenario)  # a no-op when the caller measured it (``__main__`` does)
    order = list(scenario.systems)
    skipped = {s: why for s in order if (why := skip_reason(s))}
    runs: dict[str, list[dict]] = {s: [] for s in order}
    for round_index in range(scenario.rounds):
        shift = round_index % len(order)
        for system in order[shift:] + order[:shift]:
            if progress is not None:
                progress.set_description(f"round {round_index + 1}/{scenario.rounds}: {system}")
            if system in skipped:
                runs[system].append({"skipped": skipped[system], "round": round_index})
            else:
                try:
                    run = run_system(scenario, system, steps=scenario.steps, warmup=scenario.warmup)
                except Exception as error:  # noqa: BLE001 - a failing system is reported, the others still run
                    run = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
                runs[system].append({**run, "round": round_index})
            if progress is not None:
                progress.update(1)
    merged = {system: merge(scenario, found) for system, found in runs.items()}
    if cut is not None:
        merged["zbv-mem"]["cut"] = cut.as_dict()
    return merged


def merge(scenario: Scenario, runs: list[dict]) -> dict:
    """One system's runs merged: pooled medians, and per run (``per_round_tokens_per_s``, in the order of
    ``round_of_run``, the round each good run belongs to) its own median."""
    if runs and all("skipped" in r for r in runs):
        return {"skipped": runs[0]["skipped"], "runs": 0}
    good = [r for r in runs if "error" not in r and "skipped" not in r]
    if not good:
        return {"error": runs[0]["error"], "runs": len(runs)}
    samples = [scenario.tokens_per_step / t for r in good for t in r["times"]]
    per_run = [statistics.median(scenario.tokens_per_step / t for t in r["times"]) for r in good]
    first = good[0]
    out = {
        "tokens_per_s": statistics.median(samples), "samples_tokens_per_s": samples,
        "per_round_tokens_per_s": per_run, "round_of_run": [r.get("round", i) for i, r in enumerate(good)],
        "step_s": statistics.median(t for r in good for t in r["times"]),
        "loss": first["losses"][-1], "losses": first["losses"],
        "loss_same_every_round": all(r["losses"] == first["losses"] for r in good),
        "peak_growth_bytes": max(r["peak_growth_bytes"] for r in good),
        "processes": first["processes"], "threads": first["threads"], "runs": len(good),
        "failed_runs": [r["error"] for r in runs if "error" in r],
    }
    for key in SYSTEM_EXTRAS:
        if key in first:
            out[key] = first[key]
    if all("wait_s" in r for r in good):
        out.update(_load_free(scenario, good))
    return out


def _load_free(scenario: Scenario, good: list[dict]) -> dict:
    """The steps' run-queue waits (bench/measured/common.py) and the tokens/s of the steps less them: a
    step that waited ``w`` of its ``t`` seconds for a core would have taken at least ``t - w`` unloaded (the
    longest wait of one thread of one rank; waits on several ranks that add up are not subtracted)."""
    pairs = [(t, w) for r in good for t, w in zip(r["times"], r["wait_s"], strict=True)]
    return {
        "wait_s": statistics.median(w for _, w in pairs),
        "cpu_s": statistics.median(c for r in good for c in r["cpu_s"]),
        "wait_share": statistics.median(w / t for t, w in pairs),
        "tokens_per_s_less_wait": statistics.median(scenario.tokens_per_step / max(t - w, 1e-9) for t, w in pairs),
    }


PROBE_MICROBATCHES_PER_WORKER = 2
"""A probe runs ``2 x workers`` micro-batches (not the scenario's): every schedule already holds its
steady-state activations (1F1B and ZB-V at most ``2 x workers`` micro-batches in flight on a rank), each
data-parallel rank accumulates over two, and a probe at a long sequence costs a fraction of a full step."""


PROBE_WARMUP, PROBE_STEPS = 1, 1
"""A probe trains two steps, its peak the most over both: the optimizer state is born at the end of the
first step, so only from the second on does a step hold it beside its activations. Measured (tiny
scenario, 1,024 tokens, probe shape, peak RSS growth per rank after steps 1, 2, 3): ddp 411/457/457 MiB,
zbv 374/443/443, torch 1F1B 346/391/391, zero2 482/549/555, fsdp-offload 358/431/444: the second step
adds 35-70 MiB, a third little more. One step alone would pass lengths that a training run cannot hold."""


def probe_scenario(scenario: Scenario) -> Scenario:
    m = min(scenario.microbatches, PROBE_MICROBATCHES_PER_WORKER * scenario.workers)
    return scenario.with_(microbatches=m, global_batch=m * scenario.micro_batch)


def probe(scenario: Scenario, system: str, seq_len: int) -> dict:
    """``PROBE_WARMUP + PROBE_STEPS`` steps at ``seq_len`` in fresh processes: fits when they run and the
    peak is within the budget."""
    budget = scenario.memory_budget_mib * 2**20
    from bubbleless_runtime.signals import RunInterrupted

    try:
        run = run_system(probe_scenario(scenario), system, steps=PROBE_STEPS, warmup=PROBE_WARMUP, seq_len=seq_len)
    except RunInterrupted:
        raise  # SIGTERM or Ctrl-C stops the search; it is not a length that does not fit
    except Exception as error:  # noqa: BLE001 - out of memory or any failure: this length does not train
        return {"seq_len": seq_len, "fits": False, "why": f"{type(error).__name__}: {str(error)[:200]}"}
    fits = run["peak_growth_bytes"] <= budget
    return {"seq_len": seq_len, "fits": fits, "peak_growth_bytes": run["peak_growth_bytes"], "wall_s": run["wall_s"],
            "why": "" if fits else f"peak {run['peak_growth_bytes'] / 2**20:.0f} MiB over the budget"}


def longest_sequence(scenario: Scenario, system: str, *, progress=None, probe_fn=probe) -> dict:
    """The longest sequence in [longest_low, longest_high] that fits, to ``longest_granularity`` tokens
    (``longest.search``: a grid length that fits whose next grid length fails, the next length to probe
    read off the peaks measured so far; each probe a step in fresh processes, so never start at the top).

    ``probe_fn(scenario, system, seq_len) -> {"fits": bool, "peak_growth_bytes": int, ...}`` (default:
    ``probe``, fresh processes; without ``peak_growth_bytes`` the search doubles and bisects).
    Assumes a longer sequence never needs less memory, as every system's activations grow with it.
    """
    from .longest import search

    def fits(seq: int) -> dict:
        if progress is not None:
            progress.set_description(f"longest sequence: {system} at {seq}")
        result = probe_fn(scenario, system, seq)
        if progress is not None:
            progress.update(1)
        return result

    started = time.perf_counter()
    found = search(fits, budget=scenario.memory_budget_mib * 2**20, low=scenario.longest_low,
                   cap=scenario.longest_high, granularity=scenario.longest_granularity)
    return {**found, "wall_s": time.perf_counter() - started}
