"""More modelled plots for bench/results/ (issue 10, section 5): tokens/s and longest sequence per system
on every hardware profile, and tokens/s against the sequence length. Every number in them is modelled."""

from __future__ import annotations

from pathlib import Path

from bubbleless_partition import shape

SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
SEQ_MODEL, SEQ_HARDWARE, SEQ_GPUS = "llama-3.1-8b", "rtx4090", 8


def per_hardware(grid, folder: Path, plt, names, colour, models, hardware_names) -> list[str]:
    lines = []
    for metric, label in (("tokens_per_s", "tokens/s (modelled; missing bar: does not fit)"),
                          ("max_seq_len", "longest sequence (modelled)")):
        fig, axes = plt.subplots(1, len(hardware_names), figsize=(4.2 * len(hardware_names), 3.8), sharey=True)
        width = 0.8 / len(names)
        for ax, hw in zip(axes, hardware_names, strict=True):
            for k, system in enumerate(names):
                xs = [i + k * width for i in range(len(models))]
                values = [getattr(grid.get(system, m, hw, 8), metric) for m in models]
                ax.bar(xs, values, width, label=system, color=colour[system])
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], [shape(m).name for m in models],
                          fontsize=7, rotation=15)
            ax.set_yscale("log")
            ax.set_title(f"8x {hw}", fontsize=9)
        axes[0].set_ylabel(label, fontsize=8)
        axes[-1].legend(fontsize=6)
        fig.tight_layout()
        name = f"modelled_{metric}_per_hardware.png"
        fig.savefig(folder / name, dpi=100)
        plt.close(fig)
        lines += [f"![{metric} per hardware]({name})", ""]
    return lines


def versus_sequence(grid, folder: Path, plt, systems, colour) -> list[str]:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for system in systems:
        preds = [grid.get(system, SEQ_MODEL, SEQ_HARDWARE, SEQ_GPUS, seq_len=s) for s in SEQ_LENS]
        ax.plot(SEQ_LENS, [p.tokens_per_s if p.fits else float("nan") for p in preds], marker="o", label=system,
                color=colour[system])
    ax.set_xscale("log", base=2)
    ax.set_xticks(SEQ_LENS, [f"{s // 1024}K" for s in SEQ_LENS])
    ax.set_xlabel("sequence length (32 sequences per step)", fontsize=8)
    ax.set_ylabel("tokens/s (modelled)", fontsize=8)
    ax.set_title(f"{shape(SEQ_MODEL).name} on {SEQ_GPUS}x {SEQ_HARDWARE}: tokens/s against sequence (modelled; "
                 "missing: does not fit)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "modelled_vs_seq_len.png", dpi=100)
    plt.close(fig)
    return ["![tokens/s against sequence length](modelled_vs_seq_len.png)", ""]
