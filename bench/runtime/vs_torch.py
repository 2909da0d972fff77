"""Step time of bubbleless_runtime.Pipeline against torch.distributed.pipelining, same layers, same schedule.

    python bench/runtime/vs_torch.py [--steps 15] [--width 128] [--microbatch 32] [--out bench/results/runtime.md]

CPU, 4 gloo ranks (one thread each), both runtimes in one run, alternating step by step so load on a
shared machine hits both alike. Schedules: 1F1B (4 stages), interleaved 1F1B (8 stages, looped) and ZB-V
(8 stages in a V; torch's ScheduleZBVZeroBubble). The model is 8 pre-norm MLP blocks; torch gets
``scale_grads=False`` so both compute gradients of the summed loss. The measured bubble rate comes from
our own trace (``Pipeline.last_timeline``); the simulator's from ``predicted_timeline`` under the costs
calibrated from that trace (``trace.calibrated_costs``); ``bubble_fidelity.py`` is the benchmark for those.
Writes its section of a markdown record (``record.write_section``).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import time

import torch
import torch.distributed as dist
from torch import nn

try:  # imported as bench.runtime.vs_torch (bench/measured reuses torch_schedule)
    from bench.runtime.blocks import Block
    from bench.runtime.record import write_section
except ImportError:  # run as a script: bench/runtime is sys.path[0]
    from blocks import Block
    from record import write_section

from bubbleless_runtime import Pipeline, spawn
from bubbleless_runtime.trace import calibrated_costs

CASES = [  # (label, our schedule name, torch schedule class name, stage placement)
    ("1F1B", "1f1b", "Schedule1F1B", "loop1"),
    ("interleaved 1F1B", "interleaved-1f1b", "ScheduleInterleaved1F1B", "loop2"),
    ("ZB-V", "zbv", "ScheduleZBVZeroBubble", "v"),
]
NUM_BLOCKS = 8


def make_blocks(width: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [Block(width) for _ in range(NUM_BLOCKS)]


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target, reduction="sum")


def torch_schedule(rank: int, p: int, placement: str, torch_class: str, width: int, m: int, blocks, *,
                   loss=loss_fn):
    """This rank's torch.distributed.pipelining schedule over ``blocks`` (cut evenly into its stages) and a
    ``step(x, y)`` that returns the summed loss on the last stage's rank (None elsewhere)."""
    from torch.distributed import pipelining

    num_stages = p if placement == "loop1" else 2 * p
    if placement == "loop1":
        mine = [rank]
    elif placement == "loop2":
        mine = [rank, rank + p]
    else:
        mine = [rank, 2 * p - 1 - rank]
    per_stage = len(blocks) // num_stages
    stages = [
        pipelining.PipelineStage(nn.Sequential(*blocks[s * per_stage:(s + 1) * per_stage]), s, num_stages,
                                 torch.device("cpu"))
        for s in mine
    ]
    cls = getattr(pipelining, torch_class)
    first = stages[0] if placement == "loop1" else stages
    schedule = cls(first, m, loss_fn=loss, scale_grads=False)
    holds_first = 0 in mine
    holds_last = num_stages - 1 in mine

    def step(x, y):
        args = (x,) if holds_first else ()
        if holds_last:
            losses: list = []
            schedule.step(*args, target=y, losses=losses)
            return sum(float(v) for v in losses)
        schedule.step(*args)
        return None

    return step


def worker(rank: int, steps: int, width: int, microbatch: int) -> list[dict]:
    torch.set_num_threads(1)
    p = dist.get_world_size()
    m = 2 * p
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(m * microbatch, width, generator=g), torch.randn(m * microbatch, width, generator=g)
    rows = []
    for label, ours_name, torch_class, placement in CASES:
        ours_blocks, torch_blocks = make_blocks(width), make_blocks(width)
        pipe = Pipeline(ours_blocks, schedule=ours_name, num_microbatches=m, loss_fn=loss_fn, trace=False)
        theirs = torch_schedule(rank, p, placement, torch_class, width, m, torch_blocks)
        ours_t, theirs_t, ours_loss, theirs_loss = [], [], None, None
        for i in range(steps + 2):
            for blocks, run, times in ((ours_blocks, pipe.step, ours_t), (torch_blocks, theirs, theirs_t)):
                for b in blocks:
                    b.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                loss = run(x, y)
                dist.barrier()
                if i >= 2:
                    times.append(time.perf_counter() - t0)
                if loss is not None:
                    if run is theirs:
                        theirs_loss = float(loss)
                    else:
                        ours_loss = float(loss)
        pipe.trace = True
        pipe.step(x, y)
        timeline = pipe.last_timeline
        costs = calibrated_costs(timeline)
        predicted = pipe.predicted_timeline(costs)
        rows.append({
            "label": label, "ours": statistics.median(ours_t), "torch": statistics.median(theirs_t),
            "measured_bubble": timeline.bubble_rate, "predicted_bubble": predicted.bubble_rate,
            "measured_span_bubble": timeline.span_bubble_rate, "predicted_span_bubble": predicted.span_bubble_rate,
            "ours_loss": ours_loss, "torch_loss": theirs_loss,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--microbatch", type=int, default=32)
    parser.add_argument("--out", default="bench/results/runtime.md")
    args = parser.parse_args()
    per_rank = spawn(worker, 4, args.steps, args.width, args.microbatch, threads_per_process=1, timeout=900)
    rows = per_rank[0]
    loss_rank = {r["label"]: next(pr[i]["ours_loss"] for pr in per_rank if pr[i]["ours_loss"] is not None)
                 for i, r in enumerate(rows)}
    torch_loss = {r["label"]: next(pr[i]["torch_loss"] for pr in per_rank if pr[i]["torch_loss"] is not None)
                  for i, r in enumerate(rows)}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Runtime: step time against torch.distributed.pipelining",
        "",
        "Generated by `python bench/runtime/vs_torch.py`; do not edit by hand.",
        "",
        f"Run {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} on {platform.platform()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, commit {commit}. CPU only, 4 gloo ranks "
        f"on one machine (shared, {torch.get_num_threads()} threads here; 1 torch thread per rank). Model: "
        f"{NUM_BLOCKS} pre-norm MLP blocks, width {args.width}; 8 micro-batches of {args.microbatch} rows; "
        f"median of {args.steps} steps after 2 warm-up, the two runtimes alternating step by step.",
        "",
        "| schedule | ours (ms) | torch (ms) | ours / torch | loss equal | measured bubble | simulated bubble |"
        " measured in-span bubble | simulated in-span bubble |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        same = abs(loss_rank[r["label"]] - torch_loss[r["label"]]) <= 1e-4 * abs(torch_loss[r["label"]])
        lines.append(
            f"| {r['label']} | {r['ours'] * 1e3:.1f} | {r['torch'] * 1e3:.1f} | {r['ours'] / r['torch']:.3f} | "
            f"{'yes' if same else 'NO'} | {r['measured_bubble']:.3f} | {r['predicted_bubble']:.3f} | "
            f"{r['measured_span_bubble']:.3f} | {r['predicted_span_bubble']:.3f} |"
        )
    lines += [
        "",
        "Bubble rates: idle share of the whole makespan over all ranks (and inside each rank's own span), from our",
        "trace of one more step; the simulator's use the per-stage mean F, I, W durations and the transfer latency",
        "of that same trace (`trace.calibrated_costs`). With more ranks than free cores, a rank waits for a CPU as",
        "well as for its peers, which the simulator cannot know: see the bubble fidelity section for that comparison.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(args.out, "vs-torch", text)


if __name__ == "__main__":
    main()
