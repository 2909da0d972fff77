"""Measured bubble rate against the simulator's, calibrated from the same run.

    python bench/runtime/bubble_fidelity.py [--ranks 2 4] [--width 512] [--blocks 8] [--microbatch 64]
                                            [--microbatches-per-rank 2] [--steps 5] [--out bench/results/runtime.md]

For 1F1B, interleaved 1F1B, ZB-H1 and ZB-V on gloo ranks (one torch thread each), every traced step gives:

- measured: the idle share of the whole makespan over all ranks, from ``Pipeline.last_timeline`` (a span
  is all the work of an action; only time blocked on a peer is idle, see ``Executor.run``);
- simulated: ``simulate`` of the same schedule under ``trace.calibrated_costs`` of that same step:
  per-stage mean F, I, W durations and the median transfer latency as ``comm``;
- replay: the simulator's rule (start when the rank is free and the inputs have arrived, ``comm`` after
  a cross-rank producer) applied to each action's own measured duration. measured vs replay is the error
  of the simulator's model of the runtime; replay vs simulated is what per-stage means lose (durations
  that vary from action to action: machine load, cache, the CPU a rank shares with other processes);
- CPU share: process CPU seconds over busy seconds, the lowest rank. Below ~0.95 a rank was descheduled
  while it had work, which the simulator cannot know (more runnable processes than cores).

Steps where some rank lacked its core are left out (the simulator assumes a core per rank), as long as
``--steps`` others qualify; medians over the steps used. The goal: simulated / measured within 1 +- 0.10.
With more ranks than CPUs no step can qualify; those runs take every step and carry a caveat.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time
from dataclasses import replace

import torch
import torch.distributed as dist
from blocks import Block
from record import write_section
from torch import nn

from bubbleless_runtime import Pipeline, spawn
from bubbleless_runtime.trace import calibrated_costs
from bubbleless_schedules import Timeline, simulate
from bubbleless_schedules.layouts import layout_of

CASES = [("1F1B", "1f1b"), ("interleaved 1F1B", "interleaved-1f1b"), ("ZB-H1", "zb-h1"), ("ZB-V", "zbv")]
WARMUP = 2


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target, reduction="sum")


def replay_bubble(timeline: Timeline, comm: float) -> float:
    """Bubble rate of the simulator's rule run over each action's measured duration (same order)."""
    schedule = timeline.schedule
    layout = layout_of(schedule)
    rows = [list(row) for row in timeline.per_worker]
    position, free_at, happened = [0] * len(rows), [0.0] * len(rows), {}
    progressed = True
    while progressed:
        progressed = False
        for worker, row in enumerate(rows):
            while position[worker] < len(row):
                span = row[position[worker]]
                needs = layout.requires(span.action, schedule)
                if any(event not in happened for event in needs):
                    break
                start = max([free_at[worker]] + [t + (comm if w != worker else 0.0)
                                                 for t, w in (happened[e] for e in needs)])
                free_at[worker] = start + (span.end - span.start)
                for event in layout.produces(span.action, schedule):
                    happened[event] = (free_at[worker], worker)
                position[worker] += 1
                progressed = True
    assert all(p == len(r) for p, r in zip(position, rows, strict=True)), "replay deadlocked"
    makespan = max(free_at)
    busy = sum(span.end - span.start for span in timeline.spans)
    return 1.0 - busy / (makespan * len(rows))


def worker(rank: int, width: int, blocks: int, microbatch: int, m: int, steps: int, min_share: float) -> list[dict]:
    """Traced steps until ``steps`` of them ran with every rank on its own core (CPU share at least
    ``min_share``), at most 4x ``steps``; every traced step is returned, marked."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(m * microbatch, width, generator=g), torch.randn(m * microbatch, width, generator=g)
    rows = []
    for label, name in CASES:
        torch.manual_seed(0)
        layers = [Block(width) for _ in range(blocks)]
        pipe = Pipeline(layers, schedule=name, num_microbatches=m, loss_fn=loss_fn)
        qualified, i = 0, 0
        while i < WARMUP + 4 * steps and qualified < steps:
            i += 1
            for layer in layers:
                layer.zero_grad(set_to_none=True)
            dist.barrier()
            cpu = time.process_time()
            pipe.step(x, y)
            cpu = time.process_time() - cpu
            if i <= WARMUP:
                continue
            timeline = pipe.last_timeline
            share = torch.tensor([cpu / timeline.busy(rank)])
            dist.all_reduce(share, op=dist.ReduceOp.MIN)
            qualified += float(share) >= min_share
            costs = calibrated_costs(timeline)
            rows.append({
                "label": label, "qualified": float(share) >= min_share, "measured": timeline.bubble_rate,
                "simulated": simulate(pipe.schedule, costs).bubble_rate,
                "simulated_no_comm": simulate(pipe.schedule, replace(costs, comm=0.0)).bubble_rate,
                "replay": replay_bubble(timeline, costs.comm),
                "comm_us": costs.comm * 1e6, "makespan_ms": timeline.makespan * 1e3,
                "cpu_share": float(share),
            })
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per schedule: medians over the steps where every rank had its core (over all steps when none did;
    the timeline, hence every number, is the same on every rank)."""
    out = []
    for label, _ in CASES:
        traced = [r for r in rows if r["label"] == label]
        steps = [r for r in traced if r["qualified"]] or traced
        med = {key: statistics.median(s[key] for s in steps) for key in steps[0] if key not in ("label", "qualified")}
        ratios = [s["simulated"] / s["measured"] if s["measured"] > 0 else float("nan") for s in steps]
        used = f"{len(steps)} of {len(traced)}" if steps is not traced else f"all {len(traced)}, none with a core per rank"
        close = sum(abs(r - 1.0) <= 0.10 for r in ratios)
        out.append({"label": label, **med, "ratio": statistics.median(ratios), "steps": used,
                    "close": f"{close} of {len(ratios)}"})
    return out


def table(ranks: int, m: int, rows: list[dict]) -> list[str]:
    lines = [
        f"**{ranks} ranks, {m} micro-batches**",
        "",
        "| schedule | measured | simulated | simulated / measured | within 10% | replay | simulated, comm 0 |"
        " comm (us) | makespan (ms) | CPU share | steps used | steps within 10% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ok = "yes" if abs(r["ratio"] - 1.0) <= 0.10 else "no"
        lines.append(
            f"| {r['label']} | {r['measured']:.4f} | {r['simulated']:.4f} | {r['ratio']:.3f} | {ok} | "
            f"{r['replay']:.4f} | {r['simulated_no_comm']:.4f} | {r['comm_us']:.0f} | {r['makespan_ms']:.0f} | "
            f"{r['cpu_share']:.2f} | {r['steps']} | {r['close']} |"
        )
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--microbatch", type=int, default=64)
    parser.add_argument("--microbatches-per-rank", type=int, default=2, help="m = this times the ranks")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--min-cpu-share", type=float, default=0.95,
                        help="a step counts when every rank's CPU time is at least this share of its busy time")
    parser.add_argument("--out", default="bench/results/runtime.md")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    lines = [
        "## Measured bubble rate against the simulator's",
        "",
        "Generated by `python bench/runtime/bubble_fidelity.py`; do not edit by hand.",
        "",
        f"Run {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} on {platform.platform()}, "
        f"{os.cpu_count()} CPUs (load average {load:.2f} at start: other processes share them), Python "
        f"{platform.python_version()}, torch {torch.__version__}, commit {commit}. Gloo ranks, 1 torch thread "
        f"each. Model: {args.blocks} pre-norm MLP blocks, width {args.width}; {args.microbatches_per_rank} "
        f"micro-batches of {args.microbatch} rows per rank. Per schedule {WARMUP} warm-up steps, then traced steps "
        f"until {args.steps} ran with every rank on its own core (CPU share >= {args.min_cpu_share}; at most "
        f"{4 * args.steps}); each number is the median over those steps.",
        "",
    ]
    for ranks in args.ranks:
        m = args.microbatches_per_rank * ranks
        oversubscribed = ranks > (os.cpu_count() or 1)
        min_share = 0.0 if oversubscribed else args.min_cpu_share  # no step could qualify: take them all
        per_rank = spawn(worker, ranks, args.width, args.blocks, args.microbatch, m, args.steps, min_share,
                         threads_per_process=1, timeout=1800)
        lines += table(ranks, m, summarize(per_rank[0]))
        if oversubscribed:
            lines += [f"{ranks} ranks on {os.cpu_count()} CPUs: ranks take turns on the cores, so an action runs "
                      "slower when more ranks are busy at once and a blocked rank lends its core to another. "
                      "The simulator assumes a core per rank; this row shows the size of that effect, not the "
                      "simulator's accuracy.", ""]
    lines += [
        "Measured: idle share of the whole makespan over all ranks in the run's own trace, where a span is all "
        "of its action's work (transfers posted, bookkeeping, compute) and only time blocked on a peer is idle. "
        "Simulated: the simulator on the same schedule, with each stage's mean F, I, W durations from the same "
        "step and comm = the median delay from a producer's end to a waiting consumer's start on another rank "
        "(`bubbleless_runtime.trace.calibrated_costs`). Replay: the simulator's rule over each action's own "
        "duration; measured vs replay is the error of the model, replay vs simulated is the spread of "
        "durations that per-stage means cannot hold. CPU share: process CPU time over busy time, worst rank; "
        "steps where another process took a rank's core are left out when enough others qualify, since the "
        "simulator assumes a core per rank (steps used says how many).",
        "",
        "Simulated / measured is the median of the per-step ratios; steps within 10% counts the steps whose own "
        "ratio is. ZB-V's bubble is small (~5% of the makespan on 2 ranks), so one action running 1 ms long "
        "moves its rate by a tenth: single steps spread where replay still equals measured (the runtime did "
        "what the rule says, the per-stage means just cannot hold one slow action). Before the runtime gave "
        "each direction between two ranks its own gloo group, ZB-V also lost 2-6 ms in some steps where both "
        "ranks sent to each other at once (measured above replay; ratio 0.69 to 0.94 across quiet runs): two "
        "opposite transfers over one gloo pair stall, see the gloo-crossing-sends section.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(args.out, "bubble-fidelity", text)


if __name__ == "__main__":
    main()
