"""The PNG beside a measured record (measured.md -> measured.png): measured tokens/s and longest sequence per system, one bar each (ours coloured
apart from the baselines)."""

from __future__ import annotations

from pathlib import Path


def write_plot(systems: dict, path: Path, scenario_name: str, ours) -> list[str]:
    try:
        import matplotlib
    except ImportError:
        return ["(no plot: matplotlib is not installed)", ""]
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, r in systems.items() if "error" not in r and "skipped" not in r]
    colours = ["C0" if n in ours else "C7" for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    axes[0].bar(names, [systems[n]["tokens_per_s"] for n in names], color=colours)
    axes[0].set_title("tokens/s (measured, CPU; blue: ours)", fontsize=9)
    seqs = [systems[n].get("max_seq_len") or 0 for n in names]
    axes[1].bar(names, seqs, color=colours)
    axes[1].set_title("longest sequence under the RSS budget (measured; 0: not searched)", fontsize=9)
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    fig.suptitle(f"scenario {scenario_name}", fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [f"![measured {scenario_name}]({path.name})", ""]
