"""RoundRobinPipeline on CPU devices: its overhead, one device to two, and the simulator's step time.

    python -m bench.roundrobin.figures [--width 512] [--blocks 16] [--microbatches 16] [--rows 32]
        [--steps 10] [--max-steps 40] [--warmup 2] [--rounds 2] [--cut2 auto F/L/B ...]
        [--out bench/results/roundrobin.md]

Run it from the repository root, as a module (it imports ``bench.runtime.blocks`` and ``bench.runtime.record``).
One process, ``torch.set_num_threads(1)``: each pool device is a thread running its ops on one core. A
round builds copies of one model (the runtime benchmarks' pre-norm MLP blocks, one seed) for these
contenders and runs them alternately, step by step, the order rotating:

- plain: ``nn.Sequential`` of the blocks, forward and backward of every micro-batch with the model's own
  autograd (no pipeline, no copies), the loss summed over the micro-batches as the pool sums it;
- plain on two threads: two copies, each training half the micro-batches on its own thread (data
  parallel without the all-reduce): what two cores of this machine give this model with no pipeline;
- one device: ``RoundRobinPipeline(..., devices=["cpu"], partition="auto")``;
- two devices: ``devices=["cpu"] * 2`` with each cut of ``--cut2``: ``auto`` (``partition="auto"``) or a
  pinned ``F/L/B`` (forward groups / fused last group / backward groups, in layers, e.g. ``2,2/4/4``),
  priced for the simulator from the one-device pipeline's profile. Default: ``auto``, the halves cut
  (``halves_cut``: the fused last group half the layers, the other half one backward group, two forward
  groups of a quarter: on two devices each gets a forward group and one of the two heavy jobs, and
  only half the layers are recomputed) and the one-forward-group cut ``auto`` often keeps
  (``one_forward_cut``, 8/8/8 for 16 layers), which loads one device with a recompute the other lacks.

Memory: glibc's allocator is told to keep freed memory for every thread (``keep_freed_memory``;
``--glibc-defaults`` runs without), as a GPU's caching allocator does; otherwise the pool's fresh worker
threads fault their gradient buffers in anew in some steps, which plain training on the main thread does not.

Every pipeline is built anew in each round, so each round profiles and cuts again. After ``--warmup``
untimed steps, timed steps run until every contender has ``--steps`` quiet ones (our threads had their
cores: CPU share >= 0.95 and other processes under a quarter of a core, from ``/proc/stat``) or
``--max-steps`` ran. Figures are medians over the quiet steps, over all steps (flagged) when too few
were quiet. Per round:

1. overhead: one device's step time over plain's (goal <= 1.15); the summed loss and every gradient
   against plain's (the same problem, or it is no baseline);
2. scaling: tokens/s of two devices over one (goal >= 1.6), the cut each used, the measured bubble
   rate and the LOAD/STORE share of device time (``last_timeline``), and what makes up the ratio: the
   work the cut adds (recompute; the devices' summed busy time over one device's), how evenly it
   splits (the busier device over the mean), and the bubble;
3. simulator: the measured step time (wall clock of ``step``) against (a) ``predicted_timeline()``,
   the profiled per-job costs the plan was made with, and (b) ``predicted_timeline(calibrated_costs(
   last_timeline))`` of each step's own spans; goal within 15%.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from bench.runtime.blocks import Block
from bench.runtime.record import write_section
from bubbleless_runtime import RoundRobinPipeline, pool_plan
from bubbleless_runtime.trace import calibrated_costs
from bubbleless_schedules import Kind
from bubbleless_schedules.roundrobin_layout import PoolGroups

OVERHEAD_GOAL, SCALING_GOAL, SIMULATOR_GOAL = 1.15, 1.6, 0.15
MIN_CPU_SHARE, MAX_OTHERS = 0.95, 0.25  # a quiet step: our threads ran while busy, others used < 1/4 core
MIN_QUIET = 5  # fewer quiet steps than this: every step is used, and the table says so
TRANSFER_KINDS = (Kind.LOAD, Kind.STORE)
KINDS = (Kind.F, Kind.R, Kind.B, *TRANSFER_KINDS)


def loss_fn(out, target):
    return nn.functional.mse_loss(out, target, reduction="sum")


def parse_cut(text: str) -> PoolGroups | str:
    """``auto`` or ``F/L/B`` with comma-separated layer counts (``2,2/4/4``; ``-`` for no groups)."""
    if text == "auto":
        return text
    forward, last, backward = text.split("/")

    def sizes(part: str) -> tuple[int, ...]:
        return () if part in ("", "-") else tuple(int(v) for v in part.split(","))

    return PoolGroups(sizes(forward), int(last), sizes(backward))


def halves_cut(num_layers: int) -> str:
    """Two forward groups of a quarter of the layers, the fused last group half, one backward group the
    other half: on two devices (jobs alternate) each gets a forward group and one of the two heavy jobs."""
    quarter = num_layers // 4
    return f"{quarter},{quarter}/{num_layers - 2 * quarter}/{2 * quarter}"


def one_forward_cut(num_layers: int) -> str:
    """One forward group of the lower half, the fused last group the upper half, one backward group the
    lower half: what ``cut(method="roundrobin")`` gives for two backward groups of even layers."""
    half = num_layers // 2
    return f"{half}/{num_layers - half}/{half}"


def cut_text(groups: PoolGroups) -> str:
    def sizes(values) -> str:
        return ",".join(str(v) for v in values) or "-"

    return f"{sizes(groups.forward)}/{groups.last}/{sizes(groups.backward)}"


def system_busy() -> float:
    """CPU seconds every process on the machine has run (``/proc/stat``), or NaN where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:8]]
    except OSError:
        return float("nan")
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse, by every thread: one arena, no trimming, blocks up to 32 MiB
    from the heap (``mallopt``; the bound glibc allows). What the result says it ran under.

    With glibc's defaults each new worker thread may get an arena of its own and freed blocks go back to
    the OS, so a step's first backward faults its gradient buffers in afresh (on this VM 50 -> 200-500 ms
    for 134 MB, now and then), a cost plain training on the main thread does not pay and a GPU's caching
    allocator never has. Settings in the environment (``MALLOC_*``) are applied by glibc before this."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "the C library's allocator as it is (no glibc mallopt)"
    m_trim_threshold, m_top_pad, m_mmap_threshold, m_arena_max = -1, -2, -3, -8
    settings = ((m_arena_max, 1), (m_mmap_threshold, 32 << 20), (m_trim_threshold, 1 << 40), (m_top_pad, 256 << 20))
    if not all(mallopt(option, value) == 1 for option, value in settings):
        return "glibc's allocator, partly retuned (mallopt refused a setting)"
    return ("glibc's allocator keeping freed memory (mallopt: one arena, no trimming, mmap threshold 32 MiB, "
            "top pad 256 MiB; `--glibc-defaults` runs without)")


def first_backward_excess(timeline) -> float:
    """Seconds the first B of every job took beyond the median B of that job, summed over the jobs (the
    first backward is where a job's gradient buffers are allocated)."""
    per_job: dict = {}
    for span in sorted(timeline.spans, key=lambda s: s.start):
        if span.action.kind is Kind.B:
            per_job.setdefault(span.action.stage, []).append(span.end - span.start)
    return sum(max(0.0, spans[0] - statistics.median(spans)) for spans in per_job.values())


def kind_seconds(timeline) -> dict:
    """Action kind -> the summed durations of its spans in ``timeline``."""
    totals: dict = {}
    for span in timeline.spans:
        totals[span.action.kind] = totals.get(span.action.kind, 0.0) + span.end - span.start
    return totals


@dataclass(frozen=True)
class Step:
    """One timed step of one contender; the timeline fields are None without a pipeline."""

    seconds: float
    cpu_share: float
    """Process CPU seconds over busy seconds (the device spans' sum; without a pipeline, wall x threads)."""
    others: float
    """Cores other processes used during the step (``/proc/stat`` less ours; NaN where unknown)."""
    makespan: float | None = None
    calibrated: float | None = None
    bubble: float | None = None
    transfer_share: float | None = None
    busy: tuple[float, ...] | None = None
    kinds: dict | None = None
    """Action kind -> seconds its spans took, summed over the devices."""
    first_backward: float | None = None
    """Seconds each job's first B took over the median B of that job, summed over the jobs."""

    @property
    def quiet(self) -> bool:
        return self.cpu_share >= MIN_CPU_SHARE and not self.others > MAX_OTHERS


@dataclass
class Series:
    """One contender and its timed steps."""

    name: str
    step: object
    params: list
    pipe: RoundRobinPipeline | None = None
    threads: int = 1
    steps: list[Step] = field(default_factory=list)
    loss: float | None = None

    def run(self, x, y, timed: bool) -> None:
        for p in self.params:
            p.grad = None
        system, cpu, start = system_busy(), time.process_time(), time.perf_counter()
        loss = self.step(x, y)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        others = max(0.0, system_busy() - system - cpu) / wall
        self.loss = float(loss)
        if not timed:
            return
        if self.pipe is None:
            self.steps.append(Step(wall, cpu / (wall * self.threads), others))
            return
        timeline = self.pipe.last_timeline
        busy = tuple(timeline.busy(w) for w in range(len(self.pipe.devices)))
        kinds = kind_seconds(timeline)
        moved = sum(kinds.get(k, 0.0) for k in TRANSFER_KINDS)
        self.steps.append(Step(
            wall, cpu / sum(busy), others, makespan=timeline.makespan,
            calibrated=self.pipe.predicted_timeline(calibrated_costs(timeline)).makespan,
            bubble=timeline.bubble_rate, transfer_share=moved / (timeline.makespan * len(busy)), busy=busy,
            kinds=kinds, first_backward=first_backward_excess(timeline),
        ))

    @property
    def quiet_steps(self) -> int:
        return sum(s.quiet for s in self.steps)

    @property
    def used(self) -> list[Step]:
        """The quiet steps, or every step when fewer than ``MIN_QUIET`` were quiet."""
        quiet = [s for s in self.steps if s.quiet]
        return quiet if len(quiet) >= MIN_QUIET else self.steps

    def median(self, name: str = "seconds") -> float:
        return statistics.median(getattr(s, name) for s in self.used)

    def median_busy(self, worker: int) -> float:
        return statistics.median(s.busy[worker] for s in self.used)

    def median_kind(self, kind: Kind) -> float:
        return statistics.median(s.kinds.get(kind, 0.0) for s in self.used)

    @property
    def cut(self) -> str:
        """How the cut was chosen, and the cut (``auto: 8/8/8``)."""
        how = "auto" if self.name.endswith("auto") else "pinned"
        return f"{how}: {cut_text(self.pipe.groups)}"

    @property
    def devices_and_cut(self) -> str:
        return f"{len(self.pipe.devices)} device{'s' if len(self.pipe.devices) > 1 else ''}, {self.cut}"

    def noise(self) -> tuple[str, ...]:
        """Steps used, spread (IQR over median), CPU share (steps used), others' cores (all timed steps)."""
        quiet = self.quiet_steps
        used = f"{quiet} of {len(self.steps)}" if quiet >= MIN_QUIET else f"all {len(self.steps)} ({quiet} quiet)"
        q1, _, q3 = statistics.quantiles([s.seconds for s in self.used], n=4)
        others = statistics.median(s.others for s in self.steps)
        return used, f"{(q3 - q1) / self.median():.2f}", f"{self.median('cpu_share'):.2f}", f"{others:.2f}"


def plain_step(model: nn.Module, microbatches):
    """Forward and backward of each micro-batch (indices ``microbatches``) with the model's autograd."""
    def step(xs, ys):
        total = 0.0
        for m in microbatches:
            loss = loss_fn(model(xs[m]), ys[m])
            loss.backward()
            total += loss.detach()
        return total

    return step


def two_thread_step(models, num_microbatches: int):
    """Each model trains half the micro-batches on a thread of its own; the summed loss."""
    half = num_microbatches // 2
    halves = [plain_step(models[0], range(half)), plain_step(models[1], range(half, num_microbatches))]

    def step(xs, ys):
        losses = [None, None]

        def body(k: int) -> None:
            torch.set_num_threads(torch.get_num_threads())  # a new thread's OpenMP team: see pool_worker
            losses[k] = halves[k](xs, ys)

        threads = [threading.Thread(target=body, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return losses[0] + losses[1]

    return step


def gradient_error(got: list, want: list) -> float:
    """Largest over parameters of max |got - want| / max |want|."""
    return max(float((g - w.grad).abs().max() / w.grad.abs().max().clamp_min(1e-30))
               for g, w in zip(got, want, strict=True))


def one_round(args, blocks: list[nn.Module], x, y) -> dict:
    m = args.microbatches
    chunks = lambda step: lambda x, y: step(x.chunk(m), y.chunk(m))  # noqa: E731 - plain gets the same split
    plain_model = nn.Sequential(*copy.deepcopy(blocks))
    plain = Series("plain", chunks(plain_step(plain_model, range(m))), list(plain_model.parameters()))
    twins = [nn.Sequential(*copy.deepcopy(blocks)) for _ in range(2)]
    two_threads = Series("plain, two threads", chunks(two_thread_step(twins, m)),
                         [p for t in twins for p in t.parameters()], threads=2)
    contenders, plan_seconds = [plain, two_threads], {}
    for devices, cut in [(1, "auto")] + [(2, c) for c in args.cut2]:
        partition, costs = parse_cut(cut), None
        if isinstance(partition, PoolGroups):  # a pinned cut is priced from the one-device pipeline's profile
            profiled = contenders[2].pipe
            costs = pool_plan.job_costs(profiled.profile, partition,
                                        bandwidth=pool_plan.copy_bandwidth(profiled.devices[0]))
        start = time.perf_counter()
        pipe = RoundRobinPipeline(copy.deepcopy(blocks), devices=["cpu"] * devices, num_microbatches=m,
                                  loss_fn=loss_fn, partition=partition, sample_input=x.chunk(m)[0], costs=costs)
        name = f"{devices} device{'s' if devices > 1 else ''}, {'auto' if cut == 'auto' else 'pinned ' + cut}"
        plan_seconds[name] = time.perf_counter() - start
        contenders.append(Series(name, pipe.step, list(pipe.parameters()), pipe))
    for i in range(args.warmup + args.max_steps):
        if i >= args.warmup + args.steps and all(c.quiet_steps >= args.steps for c in contenders):
            break
        shift = i % len(contenders)
        for series in contenders[shift:] + contenders[:shift]:
            series.run(x, y, timed=i >= args.warmup)
    want = plain.params
    errors = {c.name: (gradient_error([p.grad for p in c.params], want), abs(c.loss - plain.loss) / abs(plain.loss))
              for c in contenders[2:]}
    halves = zip(twins[0].parameters(), twins[1].parameters(), strict=True)
    errors[two_threads.name] = (gradient_error([a.grad + b.grad for a, b in halves], want),
                                abs(two_threads.loss - plain.loss) / abs(plain.loss))
    return {"plain": plain, "two_threads": two_threads, "one": contenders[2], "two": contenders[3:],
            "plan_seconds": plan_seconds, "errors": errors}


def machine_line(args, load_before: tuple, load_after: tuple) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return (
        f"Run {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')} on {platform.platform()}, "
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before and {load_after[0]:.2f} after (a "
        f"machine shared with other engineers' tests), Python {platform.python_version()}, torch "
        f"{torch.__version__}, commit {commit}{' (other files modified in the tree)' if dirty else ''}. One "
        f"process, torch.set_num_threads(1). Model: {args.blocks} pre-norm MLP blocks "
        f"(`bench/runtime/blocks.py`), width {args.width}; {args.microbatches} micro-batches of {args.rows} rows; "
        f"loss: summed MSE. Per round {args.warmup} warm-up steps of each contender, then timed steps, "
        f"alternating step by step (order rotating), until each had {args.steps} quiet steps (CPU share >= "
        f"{MIN_CPU_SHARE}, other processes under {MAX_OTHERS} cores) or {args.max_steps} ran; figures are "
        f"medians over the quiet steps (over all steps, flagged, when fewer than {MIN_QUIET} were quiet). "
        f"{args.rounds} rounds, each building and profiling its pipelines anew."
    )


def ok(passed: bool) -> str:
    return "yes" if passed else "**no**"


def noise_cells(*series: Series) -> str:
    cells = zip(*(s.noise() for s in series), strict=True)
    return " | ".join(" / ".join(cell) for cell in cells)


NOISE_HEADER = "steps used | spread | CPU share | others' cores |"
NOISE_NOTE = (
    "Noise columns, contender by contender: quiet steps used of those timed; spread, the interquartile range "
    "of the step times used over their median; CPU share, process CPU seconds over busy seconds (median of "
    "the steps used); others' cores, what other processes ran during our steps (median of all timed steps)."
)


def overhead_section(rounds, header: str) -> str:
    lines = [
        "# Round-robin pool on CPU devices",
        "",
        "Generated by `python -m bench.roundrobin.figures`; do not edit by hand.",
        "",
        header,
        "",
        "## One CPU device against plain training",
        "",
        "Plain: the same blocks as one `nn.Sequential`, forward and backward of each micro-batch with the "
        "model's own autograd. One device: `RoundRobinPipeline(devices=['cpu'], partition='auto')`, which "
        "copies every weight to the device and every gradient back into host fp32 accumulators, then "
        "into `.grad`. The errors compare the summed loss and every `.grad` of the last step with plain's "
        "(max abs difference over max abs value). Goal: one device / plain <= 1.15. Where the difference "
        "goes (medians): the LOAD and STORE spans; the time outside the timeline's makespan (starting the "
        "device thread, zeroing the host gradient accumulators, copying them into `.grad`); the rest of "
        "the makespan over plain's step (compute with the pool's bookkeeping: saved-tensor accounting, "
        "host copies of inputs and outputs), and of that, how much longer each job's first backward took "
        "than its median one (it allocates the job's gradient buffers: fresh pages unless the allocator "
        "kept freed memory, see Memory above).",
        "",
        f"| round | cut (F/L/B) | plain (ms) | one device (ms) | one / plain | within goal | LOAD + STORE (ms) | "
        f"outside makespan (ms) | other compute over plain (ms) | of which first B (ms) | loss rel. err | "
        f"grad rel. err | {NOISE_HEADER}",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds, 1):
        plain, one = r["plain"], r["one"]
        ratio = one.median() / plain.median()
        grad, loss = r["errors"][one.name]
        moved = sum(one.median_kind(k) for k in TRANSFER_KINDS)
        outside = statistics.median(s.seconds - s.makespan for s in one.used)
        compute = one.median("makespan") - moved - plain.median()
        lines.append(
            f"| {index} | {one.cut} | {plain.median() * 1e3:.1f} | {one.median() * 1e3:.1f} | {ratio:.3f} | "
            f"{ok(ratio <= OVERHEAD_GOAL)} | {moved * 1e3:.1f} | {outside * 1e3:.1f} | {compute * 1e3:.1f} | "
            f"{one.median('first_backward') * 1e3:.1f} | {loss:.1e} | {grad:.1e} | {noise_cells(plain, one)} |"
        )
    lines += ["", NOISE_NOTE]
    return "\n".join(lines)


def scaling_section(args, rounds) -> str:
    tokens = args.microbatches * args.rows
    halves, single = halves_cut(args.blocks), one_forward_cut(args.blocks)
    lines = [
        "## Two CPU devices against one",
        "",
        f"Tokens/s: {tokens} rows per step over the median step time; the same model and batch on all, one "
        "torch thread per device. Goal: two / one >= 1.6. Machine: plain training on two threads (each "
        "half the micro-batches on its own copy of the model, no pipeline) over plain on one, what two cores "
        "of this machine give this model. What the ratio is made of (medians over the steps used): work, "
        "the two devices' summed busy time over the one device's (above 1: the backward groups recompute "
        "their forward); bubble, the idle share of the devices' time within the makespan "
        "(`last_timeline.bubble_rate`, an uneven split between the devices included; balance: the busier "
        "device over the mean); so two / one is about 2 (1 - bubble) / work, less the serial time outside "
        "the makespan (starting the threads, zeroing the host gradients, copying them into `.grad`). "
        "LOAD/STORE: those spans' share of the devices' time. Jobs alternate between the two devices "
        f"(job k on device k mod 2), so the cut decides the balance: under {single} (one forward group, the "
        "fused upper half, one backward group) one device runs the forward, recompute and backward of the "
        "lower half and the other only the fused half; under the halves cut "
        f"{halves} each device runs a forward group and one of the two heavy jobs. `partition='auto'` "
        "keeps the forward grouping `cut(method='roundrobin')` gives each backward cut (the fewest forward "
        f"groups no slower than the slowest backward job), so its candidates include {single} and never "
        f"{halves}; which it keeps depends on the profile of that round.",
        "",
        "| round | cut two (F/L/B) | one device (tokens/s) | two devices (tokens/s) | two / one | within goal | "
        "machine | work | bubble | 2 (1 - bubble) / work | balance | outside makespan one / two (ms) | "
        f"LOAD/STORE | busy per device (ms) | grad rel. err | {NOISE_HEADER}",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds, 1):
        one, plain, threads = r["one"], r["plain"], r["two_threads"]
        for two in r["two"]:
            ratio = one.median() / two.median()
            busy = [two.median_busy(w) for w in range(2)]
            work, bubble = sum(busy) / one.median_busy(0), two.median("bubble")
            outside = " / ".join(f"{statistics.median(s.seconds - s.makespan for s in c.used) * 1e3:.0f}"
                                 for c in (one, two))
            lines.append(
                f"| {index} | {two.cut} | {tokens / one.median():.0f} | "
                f"{tokens / two.median():.0f} | {ratio:.3f} | {ok(ratio >= SCALING_GOAL)} | "
                f"{plain.median() / threads.median():.3f} | {work:.3f} | {bubble:.3f} | "
                f"{2 * (1 - bubble) / work:.3f} | {max(busy) / statistics.mean(busy):.3f} | {outside} | "
                f"{two.median('transfer_share'):.3f} | {' / '.join(f'{b * 1e3:.0f}' for b in busy)} | "
                f"{r['errors'][two.name][0]:.1e} | {noise_cells(one, two, threads)} |"
            )
    lines += ["", NOISE_NOTE.replace("contender by contender", "one device / two devices / plain on two threads")]
    return "\n".join(lines)


def simulator_section(rounds) -> str:
    lines = [
        "## The simulator's step time against the measured one",
        "",
        "Measured: the wall clock of `step` (makespan: the timeline's, which leaves out starting the threads "
        "and copying the host gradients into `.grad`). (a) `predicted_timeline()`: the per-job costs the "
        "plan was made with, profiled before running (F, R, I, W per layer; LOAD/STORE at the measured "
        "copy bandwidth). (b) `predicted_timeline(calibrated_costs(last_timeline))`: per-job mean spans of "
        "each step, the median over the steps used. Goal: predicted / measured within 1 +- 0.15.",
        "",
        "| round | devices, cut (F/L/B) | measured step (ms) | measured makespan (ms) | (a) profiled (ms) | "
        "(a) / measured | (b) calibrated (ms) | (b) / measured | within goal (a), (b) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(rounds, 1):
        for series in (r["one"], *r["two"]):
            measured = series.median()
            profiled = series.pipe.predicted_timeline().makespan / 1e3  # the profile is in ms
            calibrated = series.median("calibrated")
            a, b = profiled / measured, calibrated / measured
            lines.append(
                f"| {index} | {series.devices_and_cut} | {measured * 1e3:.1f} | "
                f"{series.median('makespan') * 1e3:.1f} | {profiled * 1e3:.1f} | {a:.3f} | {calibrated * 1e3:.1f} | "
                f"{b:.3f} | {ok(abs(a - 1) <= SIMULATOR_GOAL)}, {ok(abs(b - 1) <= SIMULATOR_GOAL)} |"
            )
    lines += [
        "",
        "Where (a) goes wrong: each kind's spans summed over the devices (ms per step), in the profiled "
        "prediction and as measured (median over the steps used). The profile (`bubbleless_partition."
        "profile` via `partition='auto'`) times each layer alone, five times on one micro-batch, so its "
        "weights and activations are in cache, where a step streams every layer through once; it prices "
        "B as I + W timed as two separate autograd passes; and LOAD/STORE move the weights at "
        "`pool_plan.copy_bandwidth`, a copy into a buffer it reuses, where a LOAD copies into fresh "
        "tensors. (b) uses each job's measured spans, so what is left is the simulator's model of the "
        "executor.",
        "",
        "| round | devices, cut (F/L/B) | " + " | ".join(f"{k.value} profiled / measured" for k in KINDS) + " |",
        "|---|---|" + "---|" * len(KINDS),
    ]
    for index, r in enumerate(rounds, 1):
        for series in (r["one"], *r["two"]):
            profiled = kind_seconds(series.pipe.predicted_timeline())  # ms
            cells = " | ".join(f"{profiled.get(k, 0.0):.0f} / {series.median_kind(k) * 1e3:.0f}" for k in KINDS)
            lines.append(f"| {index} | {series.devices_and_cut} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="quiet timed steps wanted per contender")
    parser.add_argument("--max-steps", type=int, default=40, help="timed steps at most, quiet or not")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cut2", nargs="+", default=None,
                        help="two-device cuts, auto and/or F/L/B (default: auto and the halves cut, see above)")
    parser.add_argument("--glibc-defaults", action="store_true", help="leave glibc's allocator untuned")
    parser.add_argument("--out", default="bench/results/roundrobin.md", help="'-' to print only")
    args = parser.parse_args()
    allocator = "glibc's allocator with its defaults" if args.glibc_defaults else keep_freed_memory()
    if args.cut2 is None:
        args.cut2 = ["auto", halves_cut(args.blocks), one_forward_cut(args.blocks)]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = [Block(args.width) for _ in range(args.blocks)]
    g = torch.Generator().manual_seed(1)
    rows = args.microbatches * args.rows
    x, y = torch.randn(rows, args.width, generator=g), torch.randn(rows, args.width, generator=g)
    load_before = os.getloadavg()
    rounds = [one_round(args, blocks, x, y) for _ in range(args.rounds)]
    plans = "; ".join(f"round {i}: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["plan_seconds"].items())
                      for i, r in enumerate(rounds, 1))
    header = (machine_line(args, load_before, os.getloadavg()) + f" Memory: {allocator}."
              f" Planning (profile and cut): {plans}.")
    sections = {
        "roundrobin-overhead": overhead_section(rounds, header),
        "roundrobin-scaling": scaling_section(args, rounds),
        "roundrobin-simulator": simulator_section(rounds),
    }
    for name, text in sections.items():
        print(text + "\n")
        if args.out != "-":
            write_section(args.out, name, text)


if __name__ == "__main__":
    main()
