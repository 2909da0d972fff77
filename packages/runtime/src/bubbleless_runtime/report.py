"""What ``bubbleless train`` reports when a run ends: the ``RunResult`` of a rank and rank 0's summary.

The measured bubble rate comes from the run's own trace (``Pipeline.last_timeline``, the last step on
every rank); the simulator's is the same schedule under costs calibrated from that step
(``trace.calibrated_costs``), so the two differ only by where the time went.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from statistics import mean

from .metrics import read_metrics


@dataclass(frozen=True)
class RunResult:
    """What a finished run reports (rank 0 prints it)."""

    losses: list[float]
    """Mean per-micro-batch loss of every optimizer step this run took, in order (empty when the run
    resumed from a checkpoint already at ``train.steps``)."""
    tokens_per_second: float
    """Non-padding input tokens (``StepStats.tokens``) per second over the steps after the first (which
    pays one-off setup); NaN when no step ran."""
    measured_bubble_rate: float
    """Idle share of the whole makespan in the last step's measured timeline, over all ranks; NaN when no
    step ran."""
    predicted_bubble_rate: float
    """The simulator's bubble rate for the same schedule under costs calibrated from that step; NaN when
    no step ran."""
    timeline_png: str | None
    """Path of the measured timeline drawn as a PNG (rank 0; None without matplotlib or steps)."""
    chrome_trace: str | None
    """Path of the measured timeline as a Chrome/Perfetto trace (rank 0; None when no step ran)."""
    checkpoint: str | None
    """Directory of the checkpoint written at the end of the run, if one was."""
    adapter: str | None
    """Directory of the saved LoRA adapter (``lora.enabled`` only)."""
    step: int = 0
    """The trainer's step count when the run ended (the checkpoint's step when nothing ran)."""
    loss_png: str | None = None
    """Path of the train (and eval) loss curve PNG beside the timeline (rank 0; None without matplotlib or
    steps)."""
    eval_losses: tuple[tuple[int, float], ...] = ()
    """(step, eval loss) of every step that evaluated, from ``metrics.jsonl`` (rank 0; empty without eval)."""
    replicas: int = 1
    """Data-parallel pools the run trained on (one per torchrun process; ``tokens_per_second`` is all of
    theirs), 1 for one pool or a stage-bound pipeline."""


def measured_costs(timeline):
    """Simulator ``Costs`` (seconds) calibrated from a measured timeline: per-stage mean F, I, W
    durations and the measured transfer latency as ``comm`` (see ``trace.calibrated_costs``)."""
    from .trace import calibrated_costs

    return calibrated_costs(timeline)


def finish(rank, pipeline, losses, tokens_per_second, out, checkpoint, adapter, step) -> RunResult:
    """The run's result on this rank. Reads ``pipeline.last_timeline``, a collective: call on every rank."""
    timeline = pipeline.last_timeline
    png = trace = loss_png = None
    evals: tuple[tuple[int, float], ...] = ()
    measured = predicted = float("nan")
    if timeline is not None:
        measured = timeline.bubble_rate
        predicted = pipeline.predicted_timeline(measured_costs(timeline)).bubble_rate
        if rank == 0:
            png, trace = write_pictures(timeline, out)
    if rank == 0 and losses:
        records = loss_records(out, losses)
        evals = tuple((r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None)
        loss_png = write_loss_curve(records, os.path.join(out, "loss.png"))
    return RunResult(losses, tokens_per_second, measured, predicted, png, trace, checkpoint, adapter, step,
                     loss_png, evals)


def loss_records(out: str, losses: list[float]) -> list[dict]:
    """The run's step records: ``out/metrics.jsonl`` (every step, earlier runs of a resumed one too), or
    steps numbered from 1 over ``losses`` when there is no such file."""
    records = [r for r in read_metrics(out) if "step" in r]
    return records or [{"step": i, "loss": loss} for i, loss in enumerate(losses, 1)]


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def plot_losses(records: list[dict], path: str | None = None, *, dpi: int = 100):
    """Train loss per step as a line, eval loss (where a step has one) as a line with markers; writes a
    PNG to ``path`` when given and returns the matplotlib Figure (object API, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 4.0), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    train = [(r["step"], r["loss"]) for r in records if _finite(r.get("loss"))]
    evals = [(r["step"], r["eval_loss"]) for r in records if _finite(r.get("eval_loss"))]
    if train:
        axes.plot([x for x, _ in train], [y for _, y in train], color="#4c72b0", linewidth=1.2, label="train loss")
    if evals:
        axes.plot([x for x, _ in evals], [y for _, y in evals], color="#dd8452", linewidth=1.5, marker="o", markersize=4, label="eval loss")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("loss (mean per micro-batch)")
    axes.set_title("loss" + (" (train and eval)" if evals else " (train)"), fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(frameon=False)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=dpi)
    return figure


def write_loss_curve(records: list[dict], path: str) -> str | None:
    """``path`` with the loss curve of ``records`` drawn into it; None without matplotlib or records."""
    if not records:
        return None
    try:
        import matplotlib  # noqa: F401  (the [cli] extra)
    except ImportError:
        return None
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    plot_losses(records, path)
    return path


def write_pictures(timeline, out: str) -> tuple[str | None, str | None]:
    """(PNG path, Chrome trace path) of ``timeline`` under ``out``; a part whose extra is missing is None."""
    os.makedirs(out, exist_ok=True)
    png = trace = None
    try:
        from bubbleless_schedules.trace import write_trace

        # measured spans are wall-clock seconds (the trace's default unit, ms, fits simulated costs)
        trace = str(write_trace(timeline, os.path.join(out, "timeline.trace.json"), time_unit="s"))
    except ImportError:
        pass
    try:
        from bubbleless_schedules.plot import plot_timeline

        png = os.path.join(out, "timeline.png")
        plot_timeline(timeline, png, time_unit="s")
    except ImportError:  # matplotlib missing: the trace is still written
        png = None
    return png, trace


def report(result: RunResult, config) -> str:
    """The closing summary printed on rank 0."""
    if not result.losses:
        return (
            f"nothing to do: the checkpoint is at step {result.step} of {config.train.steps}; "
            "raise train.steps (or --steps) to train further"
        )
    window = max(1, min(10, len(result.losses) // 5))
    first, last = mean(result.losses[:window]), mean(result.losses[-window:])
    p = config.pipeline
    if p.devices and result.replicas > 1:  # one pool per torchrun process, the gradients averaged
        workers, worker = f"{result.replicas} data-parallel pools of {len(p.devices)} devices " \
                          f"({devices_text(p.devices)} each, one per torchrun process)", "device"
        fed = "per-job F/R/B times and LOAD/STORE transfers"
    elif p.devices:  # the round-robin pool: one process, a thread per device
        workers, worker = f"{len(p.devices)} devices ({devices_text(p.devices)}, one process: pipeline.nproc " \
                          "ignored)", "device"
        fed = "per-job F/R/B times and LOAD/STORE transfers"
    else:
        workers, worker, fed = f"{p.nproc} ranks", "rank", "per-stage F/I/W times and transfer latency"
    lines = [
        f"schedule {p.schedule}, {workers}, {p.num_microbatches} micro-batches, {len(result.losses)} steps",
        f"loss          {first:.3f} -> {last:.3f}  (mean of the first / last {window} steps)",
        f"throughput    {result.tokens_per_second:,.0f} tokens/s  (padding not counted)",
        f"bubble rate   measured {result.measured_bubble_rate:.1%}  |  simulator {result.predicted_bubble_rate:.1%} "
        f"(last step; simulator fed that step's {fed}; it assumes a core per {worker}, so expect a gap when "
        f"{worker}s outnumber free cores)",
    ]
    if result.eval_losses:
        (first_step, first_eval), (last_step, last_eval) = result.eval_losses[0], result.eval_losses[-1]
        lines.insert(2, f"eval loss     {first_eval:.3f} -> {last_eval:.3f}  (steps {first_step} and {last_step}; "
                        f"perplexity {_perplexity(last_eval)})")
    if result.timeline_png:
        lines.append(f"timeline PNG  {result.timeline_png}")
    if result.loss_png:
        lines.append(f"loss curve    {result.loss_png}")
    if result.chrome_trace:
        lines.append(f"Chrome trace  {result.chrome_trace}  (open in chrome://tracing or ui.perfetto.dev)")
    if result.checkpoint:
        lines.append(f"checkpoint    {result.checkpoint}")
    if result.adapter:
        lines.append(f"LoRA adapter  {result.adapter}")
    return "\n".join(lines)


def _perplexity(loss: float) -> str:
    return f"{math.exp(loss):.4g}" if loss < 700 else "inf"  # exp overflows a float past ~709


def devices_text(devices: list[str]) -> str:
    """``cpu x4`` for repeated devices, else the list (``cuda:0, cuda:1``)."""
    if len(set(devices)) == 1 and len(devices) > 1:
        return f"{devices[0]} x{len(devices)}"
    return ", ".join(devices)


def pool_partition_effect(pipeline) -> str:
    """Report lines for a round-robin ``partition: auto``: the simulator's step and bubble under the layer
    profile for the generator's default (even) cut and for the auto cut the pool runs, and when the plans
    were ranked by their steady period (the asynchronous optimizer's overlapped steps), that period too."""
    from bubbleless_schedules import simulate
    from bubbleless_schedules.roundrobin_layout import pool_groups

    from .pool_plan import copy_bandwidth_of, generate_pool, job_costs, plan_judge

    profile, schedule = pipeline.profile, pipeline.schedule
    even = generate_pool(schedule.name or "roundrobin", None, num_layers=profile.num_layers,
                         num_devices=len(pipeline.devices), num_microbatches=pipeline.num_microbatches,
                         costs=None, options={})
    bandwidth = copy_bandwidth_of(profile, pipeline.devices[0])  # what the auto cut priced LOAD/STORE with
    by_period = pipeline.plan_objective == "period"
    ranked = ("the shortest simulated steady period of overlapped steps kept: objective period"
              if by_period else "the fastest simulated kept")
    lines = [f"partition     auto (every count of backward groups cut from the layer profile, {ranked}), with the "
             "layer profile (per-job F/R/B, LOAD/STORE at the measured copy rate)"]
    period = plan_judge("period", load_stream=pipeline.has_gpu)  # as the pool judged its plans
    for label, plan in (("even", even), ("auto", schedule)):
        groups = pool_groups(plan)
        costs = job_costs(profile, groups, bandwidth=bandwidth)
        timeline = simulate(plan, costs)
        stream = " (uploads on the copy stream)" if pipeline.has_gpu else ""
        steady = f", steady period of overlapped steps {period(plan, costs):.3f} ms{stream}" if by_period else ""
        lines.append(f"  {label} cut    forward {list(groups.forward)} last {groups.last} backward "
                     f"{list(groups.backward)}: predicted step {timeline.makespan:.3f} ms (one step alone, uploads "
                     "in the compute order), "
                     f"bubble {timeline.bubble_rate:.1%}{steady}")
    return "\n".join(lines)
