"""The modelled tables (bench/results/modelled.md) and plots: every number in them is modelled.

Grid: the four published shapes (the 235B MoE as LoRA, rank 16) on the four GPU profiles; 8 GPUs for
the per-hardware tables, 1/2/4/8 for scaling; sequence 2048, micro-batch 1, 32 sequences per step
(RoundPipe's throughput setting, one batch for every system); bf16.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bubbleless_partition import hardware, shape

from .common import Point, Prediction
from .registry import predict, systems

MODELS = ("qwen3-1.7b", "llama-3.1-8b", "qwen3-32b", "qwen3-235b-a22b")
HARDWARE_NAMES = ("rtx4090", "a800", "mi300x", "h200")
OURS = ("roundrobin", "zb", "zbv")
BASELINES = ("zero-infinity", "zero2", "fsdp-offload", "1f1b")
GPU_COUNTS = (1, 2, 4, 8)
SEQ_LEN, GLOBAL_BATCH, LORA_RANK = 2048, 32, 16


def point(model: str, hw: str, gpus: int, **changes) -> Point:
    lora = LORA_RANK if model == "qwen3-235b-a22b" else None
    return Point(shape=shape(model), hardware=hardware(hw), gpus=gpus, seq_len=SEQ_LEN,
                 global_batch=GLOBAL_BATCH, lora_rank=lora).at(**changes)


def _predicted(key: tuple) -> Prediction:
    system, model, hw, gpus, seq_len = key
    return predict(system, point(model, hw, gpus, seq_len=seq_len))


def _named(key: tuple) -> str:
    system, model, hw, gpus, seq_len = key
    return f"{system} {model} {gpus}x {hw}" + ("" if seq_len == SEQ_LEN else f" seq {seq_len}")


@dataclass
class Grid:
    """Predictions by (system, model, hardware, gpus, sequence), computed once; `bar` (a tqdm bar, or None)
    ticks once per prediction computed, naming it (the one running; in `prefetch`, where `jobs` run at once,
    the one just done): a round-robin point plans for tens of seconds."""

    cache: dict
    bar: object = None

    def get(self, system: str, model: str, hw: str, gpus: int, seq_len: int = SEQ_LEN) -> Prediction:
        key = (system, model, hw, gpus, seq_len)
        if key not in self.cache:
            if self.bar is not None:
                self.bar.set_postfix_str(_named(key))
            self.cache[key] = _predicted(key)
            if self.bar is not None:
                self.bar.update()
        return self.cache[key]

    def prefetch(self, keys, jobs: int) -> None:
        """Compute the predictions of `keys` not yet cached over `jobs` processes (each a pure function of
        its key: the same figures as `get`'s, in any order); `jobs` <= 1 leaves them to `get`."""
        missing = [k for k in dict.fromkeys(keys) if k not in self.cache]
        if jobs <= 1 or len(missing) < 2:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")  # torch in a forked child can deadlock
        with ProcessPoolExecutor(max_workers=min(jobs, len(missing)), mp_context=context) as pool:
            futures = {pool.submit(_predicted, key): key for key in missing}
            for future in as_completed(futures):
                self.cache[futures[future]] = future.result()
                if self.bar is not None:
                    self.bar.set_postfix_str(f"done {_named(futures[future])}")  # `jobs` run at once
                    self.bar.update()

    def best_baseline(self, model: str, hw: str, gpus: int) -> Prediction | None:
        fitting = [self.get(s, model, hw, gpus) for s in BASELINES]
        fitting = [p for p in fitting if p.fits]
        return max(fitting, key=lambda p: p.tokens_per_s, default=None)


def _tps(p: Prediction) -> str:
    return f"{p.tokens_per_s:,.0f}" if p.fits else "does not fit"


def _seq(p: Prediction) -> str:
    return f"{p.max_seq_len:,}" if p.max_seq_len else "-"


def _ratio(a: Prediction, b: Prediction | None) -> str:
    if b is None or not a.fits:
        return "-"
    return f"{a.tokens_per_s / b.tokens_per_s:.2f}x"


def _synchronous(grid: Grid, model: str, hw: str, gpus: int) -> Prediction:
    """Round-robin with the synchronous host optimizer, planned for it (``roundrobin-sync``)."""
    return grid.get("roundrobin-sync", model, hw, gpus)


def hardware_table(grid: Grid, hw: str, gpus: int = 8) -> list[str]:
    names = OURS + BASELINES
    lines = [f"| model | {' | '.join(names)} |", "|---|" + "---|" * len(names)]
    for model in MODELS:
        cells = [f"{_tps(grid.get(s, model, hw, gpus))} / {_seq(grid.get(s, model, hw, gpus))}" for s in names]
        lines.append(f"| {shape(model).name}{' (LoRA)' if model.endswith('a22b') else ''} | {' | '.join(cells)} |")
    return lines


def headline(grid: Grid, hw: str = "rtx4090", gpus: int = 8) -> list[str]:
    lines = ["| model | roundrobin tokens/s (one-step-stale optimizer) | best baseline | its tokens/s | ratio | "
             "ratio, synchronous optimizer | "
             "roundrobin longest seq | longest baseline seq |", "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        ours, best = grid.get("roundrobin", model, hw, gpus), grid.best_baseline(model, hw, gpus)
        longest = max((grid.get(s, model, hw, gpus).max_seq_len for s in BASELINES), default=0)
        sync = _ratio(_synchronous(grid, model, hw, gpus), best)
        lines.append(
            f"| {shape(model).name} | {_tps(ours)} | {best.system if best else 'none fits'} | "
            f"{_tps(best) if best else '-'} | {_ratio(ours, best)} | {sync} | {_seq(ours)} | {longest:,} |"
        )
    return lines


def roundrobin_breakdown(grid: Grid, hw: str = "rtx4090", gpus: int = 8) -> list[str]:
    lines = ["| model | step (s) | simulated compute + transfers (s) | CPU AdamW, overlapped (s) | fused last group "
             "alone, busiest GPU (s) | all jobs' work spread evenly (s) | baseline step (s) |",
             "|---|---|---|---|---|---|---|"]
    for model in MODELS:
        p, best = grid.get("roundrobin", model, hw, gpus), grid.best_baseline(model, hw, gpus)
        if not p.fits:
            continue
        d = p.details
        lines.append(f"| {shape(model).name} | {p.step_s:.2f} | {d['compute_s']:.2f} | {d['optimizer_s']:.2f} | "
                     f"{d['fused_last_group_s']:.2f} | {d['work_spread_evenly_s']:.2f} | "
                     f"{best.step_s:.2f} ({best.system}) |" if best else "")
    return lines


def zero_bubble_table(grid: Grid, hws=("a800", "mi300x", "h200"), gpus: int = 8) -> list[str]:
    lines = ["| hardware | model | 1f1b (torch) | bubbleless-1f1b | zb | zbv | zb / 1f1b | zbv / 1f1b |",
             "|---|---|---|---|---|---|---|---|"]
    for hw in hws:
        for model in MODELS:
            base, ours1 = grid.get("1f1b", model, hw, gpus), grid.get("bubbleless-1f1b", model, hw, gpus)
            zb, zbv = grid.get("zb", model, hw, gpus), grid.get("zbv", model, hw, gpus)
            ok = base.fits
            lines.append(f"| {hw} | {shape(model).name} | {_tps(base)} | {_tps(ours1)} | {_tps(zb)} | {_tps(zbv)} | "
                         f"{_ratio(zb, base) if ok else '-'} | {_ratio(zbv, base) if ok else '-'} |")
    return lines


def scaling_table(grid: Grid, hw: str = "rtx4090") -> list[str]:
    lines = ["| model | system | " + " | ".join(f"{g} GPU" for g in GPU_COUNTS) + " | 8 / 1 |",
             "|---|---|" + "---|" * (len(GPU_COUNTS) + 1)]
    for model in MODELS:
        for system in ("roundrobin", *BASELINES):
            preds = [grid.get(system, model, hw, g) for g in GPU_COUNTS]
            if not any(p.fits for p in preds):
                continue
            scale = (f"{preds[-1].tokens_per_s / preds[0].tokens_per_s:.2f}"
                     if preds[0].fits and preds[-1].fits else "-")
            lines.append(f"| {shape(model).name} | {system} | " + " | ".join(_tps(p) for p in preds) + f" | {scale} |")
    return lines


def _verdict(grid: Grid) -> str:
    """The goal, checked on the numbers of this run (1.7B to 32B, 8x RTX 4090)."""
    parts = []
    for model in MODELS[:3]:
        ours, best = grid.get("roundrobin", model, "rtx4090", 8), grid.best_baseline(model, "rtx4090", 8)
        if best is None or not ours.fits:
            parts.append(f"{shape(model).name}: no ratio")
            continue
        sync = _ratio(_synchronous(grid, model, "rtx4090", 8), best)
        parts.append(f"{shape(model).name} {ours.tokens_per_s / best.tokens_per_s:.2f}x ({sync} synchronous) over "
                     f"{best.system}")
    met = all(p.split()[1].endswith("x") and float(p.split()[1][:-1]) >= 2 for p in parts if "no ratio" not in p)
    return (f"**The goal (>= 2x the best baseline, 1.7B-32B) is {'met' if met else 'NOT met'} in this model:** "
            + "; ".join(parts) + ".")


def _fused_group(grid: Grid, model: str, hw: str = "rtx4090", gpus: int = 8) -> str:
    """How the round-robin plan of one headline row holds its fused last group, from that plan (its layers and
    the GPUs that run it: ``ours_pool._plan_details``), so the prose cannot go stale."""
    p, name = grid.get("roundrobin", model, hw, gpus), shape(model).name
    if not p.fits:
        return f"{name} has no plan"
    layers, on = p.details["fused_last_group_layers"], p.details["fused_last_group_gpus"]
    where = f"over {_NUMBERS[on] if on < len(_NUMBERS) else on} GPU{'s' if on > 1 else ''}"
    if layers == 1:
        return f"{name} keeps only the head in it, {where}"
    return f"{name}: a {layers}-layer fused group {where}"


_NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def why(grid: Grid) -> list[str]:
    """The prose after the verdict: ``WHY`` with the fused last group of Qwen3-1.7B and Qwen3-32B as planned,
    and the host memory round-robin's longest sequences need (``_host_memory``)."""
    fused = (f"({_fused_group(grid, 'qwen3-1.7b')}; the column 'fused last group alone' is the busiest GPU's "
             f"share; {_fused_group(grid, 'qwen3-32b')})")
    return [part.replace(FUSED_GROUPS, fused) for part in WHY] + [_host_memory(grid)]


def _host_memory(grid: Grid, hw: str = "rtx4090", gpus: int = 8) -> str:
    """What round-robin's longest sequences ask of the host, from each headline row's own figures
    (``ours_pool.pool_host_bytes``: the model's state and one sequence's layer inputs per GPU), of the rows
    computed already (the headline's)."""
    parts = []
    for model in MODELS:
        p = grid.cache.get(("roundrobin", model, hw, gpus, SEQ_LEN))
        if p is not None and p.fits and "host_state_bytes" in p.details:
            state, inputs = p.details["host_state_bytes"], p.details["host_inputs_bytes_at_max_seq"]
            parts.append(f"{shape(model).name} {(state + inputs) / 1e9:,.0f} GB ({state / 1e9:,.0f} of state)")
    if not parts:
        return ""
    return ("Those longest sequences are bounded by GPU memory alone: the pool keeps every layer's input of "
            "each micro-batch in host memory until its backward, and no hardware profile gives a server's RAM, "
            f"so none is enforced. At them it needs at least (8x RTX 4090): {'; '.join(parts)}.")


FUSED_GROUPS = "(FUSED_GROUPS)"
"""Where ``why`` puts each plan's fused last group into ``WHY``."""
WHY = [
    "The round-robin headline runs the host optimizer one step stale (`RoundRobinPipeline(optimizer={..., "
    "'asynchronous': True})`, RoundPipe's default; our default is synchronous, the 'synchronous' column): "
    "iteration i+1 computes on the weights before iteration i's update while torch's fused CPU AdamW "
    "(bench/results/cpu_adam.md: 4.6x torch's default kernel on the build VM) applies it, so the CPU step "
    "hides behind the compute (bench/results/async_overlap.md measures that on CPU devices). The baselines "
    "are synchronous, and staleness is not free: on `bubbleless train --example roundrobin` (lr 3e-3, 200 "
    "steps) the stale optimizer ended at a loss of 1.00 where the synchronous one reached 0.05, exactly as "
    "plain AdamW fed one-step-late gradients does, so judge the synchronous column too. The 235B LoRA ratio is large because ZeRO-3 gathers 470 GB of frozen weights through "
    "host memory every micro-batch pass. What still costs round-robin most, visible in the table above: (1) one "
    "pool step runs the fused last group (the LM head, 6 decoder layers' worth of FLOPs for Qwen3-1.7B) over "
    "every micro-batch, so it bounds the step the way the LM-head stage bounds 1F1B; the planner splits its "
    "micro-batches over several GPUs where their weights fit the GPU's bytes " + FUSED_GROUPS + ". (2) Backward "
    "groups recompute their forward (a third more FLOPs); uploads run on each GPU's copy stream within two "
    "jobs' weights, and consecutive steps overlap as `RoundRobinPipeline.steps` runs them (first free, two "
    "in flight): compare 'all jobs' work spread evenly' with the baseline's step "
    "for what balance alone could gain. The baselines are modelled generously (transfers perfectly "
    "overlapped with compute, no hook or launch overhead), which RoundPipe's measured baselines did not "
    "enjoy; calibrated on CPU only (bench/results/measured.md), not on a GPU. Longest sequence: round-robin "
    "is far ahead of every baseline on every model, since it keeps one layer's activations and a 4,096-token "
    "loss chunk on a GPU where the others keep every layer's checkpoint and whole logits.",
]


def _git_commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("bubbleless-schedules", "bubbleless-partition", "bubbleless-runtime", "torch"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def _dirty(root: Path) -> str:
    """Tracked files under packages/ changed but not committed when the table ran (the models import them)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "packages"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    files = [line[3:] for line in out.splitlines() if line.strip()]
    return ", ".join(f"`{f}`" for f in files) if files else "none"


def assumptions() -> list[str]:
    from bubbleless_partition import HARDWARE
    lines = ["| hardware | bf16 peak / sustained TFLOP/s | memory | HBM GB/s | host link GB/s (achieved) | "
             "peer link GB/s | host DRAM GB/s | CPU Adam params/s (torch / fused) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in HARDWARE_NAMES:
        hw = HARDWARE[name]
        peer = f"{hw.link_bandwidth:g}" if hw.peer_to_peer else "none (via host)"
        lines.append(f"| {name} | {hw.peak_tflops:g} / {hw.sustained_by_dtype['bf16']:g} | {hw.memory_gib:g} GiB | "
                     f"{hw.memory_bandwidth:g} | {hw.host_bandwidth:g} | {peer} | {hw.host_memory_bandwidth:g} | "
                     f"{hw.cpu_adam_params_per_s:.3g} / {hw.cpu_adam_fused_params_per_s:.3g} |")
    return lines


def slow_keys(plots: bool = True) -> list[tuple]:
    """The round-robin points of the report (each plans its pool for tens of seconds; the other systems'
    predictions take milliseconds): 8 GPUs of every profile, the RTX 4090 scaling and, for the plots,
    the sequence sweep."""
    from .plots import SEQ_GPUS, SEQ_HARDWARE, SEQ_LENS, SEQ_MODEL

    keys = [("roundrobin", m, hw, 8, SEQ_LEN) for hw in HARDWARE_NAMES for m in MODELS]
    keys += [("roundrobin-sync", m, "rtx4090", 8, SEQ_LEN) for m in MODELS]  # the headline's synchronous column
    keys += [("roundrobin", m, "rtx4090", g, SEQ_LEN) for m in MODELS for g in GPU_COUNTS]
    if plots:
        keys += [("roundrobin", SEQ_MODEL, SEQ_HARDWARE, SEQ_GPUS, s) for s in SEQ_LENS]
    return list(dict.fromkeys(keys))  # the 8-GPU RTX 4090 points are in the scaling and the sweep too


def write_report(out: Path, *, plots: bool = True, progress: bool = True, jobs: int = 1) -> Path:
    """Write the modelled report to `out` (and its plots beside it), with a progress bar on stderr; `jobs`
    processes compute the round-robin points first (`slow_keys`)."""
    with _progress_bar(progress) as bar:
        grid = Grid({}, bar)
        grid.prefetch(slow_keys(plots), jobs)
        return _write_report(out, grid, plots=plots)


def _progress_bar(enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        return contextlib.nullcontext()
    return tqdm(desc="modelled points", unit="point", file=sys.stderr, dynamic_ncols=True)


def _write_report(out: Path, grid: Grid, *, plots: bool) -> Path:
    root = Path(__file__).resolve().parents[2]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    parts = [
        "# Modelled throughput and longest sequence (every number here is MODELLED, none measured)",
        "",
        "Generated by `python bench/model.py --table`; do not edit by hand. Reproduce any cell with "
        "`python bench/model.py --hardware HW --gpus N --model MODEL --system SYSTEM --seq-len 2048 --json`.",
        "",
        f"Run {stamp} on {platform.platform()}, Python {platform.python_version()}, {_versions()}; commit {_git_commit(root)} "
        f"(uncommitted changes under packages/ at run time: {_dirty(root)}; packages imported from "
        f"{os.environ.get('PYTHONPATH') or 'the installed (editable) packages'}). "
        f"Setting: sequence {SEQ_LEN}, micro-batch 1, {GLOBAL_BATCH} sequences per optimizer step for every "
        f"system, bf16 mixed precision (Adam, fp32 masters); Qwen3-235B-A22B as LoRA rank {LORA_RANK}. Cost "
        "models: `bench/modelled/` (ours: `ours.py` stage-bound, `ours_pool.py` round-robin, on our planners and "
        "simulator; baselines: `baselines.py`, from their published mechanisms; shared physics and assumptions: `common.py`). Hardware: "
        "`bubbleless_partition.hardware_data` (sources per field). Calibration against measured runs: "
        "on CPU only, in bench/results/measured.md (its Calibration section: each model's CPU prediction "
        "against the measured tokens/s, with the error per system); no GPU calibration yet.",
        "",
        "## Hardware profiles used",
        "", *assumptions(), "",
        "## Headline: 8x RTX 4090, round-robin against the best baseline that fits (modelled)",
        "",
        "Best baseline: the fastest of zero-infinity, zero2, fsdp-offload and torch 1F1B that fits. The issue's "
        "goal is >= 2x for 1.7B-32B (RoundPipe published 1.48-2.16x, measured).",
        "", *headline(grid), "",
        "Where the round-robin step goes (8x RTX 4090, modelled):", "", *roundrobin_breakdown(grid), "",
        _verdict(grid) + " " + " ".join(why(grid)), "",
    ]
    for hw in HARDWARE_NAMES:
        parts += [f"## {hw}, 8 GPUs: tokens/s / longest sequence (modelled)", "", *hardware_table(grid, hw), ""]
    parts += ["## Zero-bubble schedules against torch 1F1B, 8 GPUs, weights resident (modelled)", "",
              *zero_bubble_table(grid), ""]
    parts += ["## Scaling on RTX 4090, 1/2/4/8 GPUs: tokens/s (modelled)", "", *scaling_table(grid), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    if plots:
        parts += write_plots(grid, out.parent)
    out.write_text("\n".join(parts) + "\n")
    return out


def write_plots(grid: Grid, folder: Path) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        return ["(no plots: matplotlib is not installed)", ""]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = OURS + BASELINES
    colour = {name: f"C{k}" for k, name in enumerate(names)}  # one colour per system in every plot
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / len(names)
    for k, system in enumerate(names):
        xs = [i + k * width for i in range(len(MODELS))]
        preds = [grid.get(system, m, "rtx4090", 8) for m in MODELS]
        axes[0].bar(xs, [p.tokens_per_s for p in preds], width, label=system, color=colour[system])
        axes[1].bar(xs, [p.max_seq_len for p in preds], width, label=system, color=colour[system])
    for ax, title in zip(axes, ("tokens/s (modelled; 0 = does not fit)", "longest sequence (modelled)"), strict=True):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(MODELS))], [shape(m).name for m in MODELS], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"8x RTX 4090: {title}", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "modelled_rtx4090.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(MODELS), figsize=(14, 3.6))
    for ax, model in zip(axes, MODELS, strict=True):
        for system in ("roundrobin", *BASELINES):
            preds = [grid.get(system, model, "rtx4090", g) for g in GPU_COUNTS]
            ys = [p.tokens_per_s if p.fits else float("nan") for p in preds]  # no point where it does not fit
            ax.plot(GPU_COUNTS, ys, marker="o", label=system, color=colour[system],
                    linestyle="--" if system == "fsdp-offload" else "-")
        ax.set_title(f"{shape(model).name} (modelled)", fontsize=9)
        ax.set_xlabel("RTX 4090s", fontsize=8)
        ax.set_xticks(GPU_COUNTS)
    axes[0].set_ylabel("tokens/s", fontsize=8)
    axes[0].legend(fontsize=7, title="missing: does not fit", title_fontsize=6)
    fig.tight_layout()
    fig.savefig(folder / "modelled_scaling.png", dpi=110)
    plt.close(fig)
    from .plots import per_hardware, versus_sequence

    extra = per_hardware(grid, folder, plt, names, colour, MODELS, HARDWARE_NAMES)
    extra += versus_sequence(grid, folder, plt, names, colour)
    return ["## Plots (modelled)", "", "![8x RTX 4090](modelled_rtx4090.png)", "",
            "![scaling](modelled_scaling.png)", "", *extra]


__all__ = ["Grid", "point", "systems", "write_report"]
