"""How well each partition method balances real model shapes (issue 4, section 3): printed and saved.

    python bench/partition/quality.py            # writes bench/results/partition.md
    python bench/partition/quality.py --out -    # print only

Analytic profiles (FLOP and byte counts, ``bubbleless_partition.analytic``) of Qwen3-1.7B, -8B and -32B
shapes on the RTX 4090 hardware profile (RoundPipe's setting): one 4,096-token micro-batch, the loss in
4,096-token chunks, bf16. For 4 and 8 GPUs, each method's slowest rank over the ideal (total compute
spread evenly), transfers at the cuts included. "floor" is the best any contiguous cut can do at this
layer granularity with free transfers (the DP on a transfer-free copy), so the DP's distance from 1.0
splits into granularity (floor) and transfers (the rest).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
import time
from pathlib import Path

import bubbleless_partition
from bubbleless_partition import RTX_4090, TransformerShape, analytic_profile, cut

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "partition.md"
SEQ_LEN = 4096
GPUS = (4, 8)

SHAPES = (
    TransformerShape(name="Qwen3-1.7B", num_layers=28, hidden=2048, intermediate=6144, heads=16, kv_heads=8,
                     vocab=151_936, head_dim=128),
    TransformerShape(name="Qwen3-8B", num_layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8,
                     vocab=151_936, head_dim=128),
    TransformerShape(name="Qwen3-32B", num_layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8,
                     vocab=151_936, head_dim=128),
)

# method -> how many stages it is asked for on `gpus` devices (V: two chunks per rank; round-robin: one
# backward group per GPU, and its ratio is slowest job over the mean job).
METHODS = {
    "uniform": lambda gpus: gpus,
    "params": lambda gpus: gpus,
    "greedy-band": lambda gpus: gpus,
    "dp": lambda gpus: gpus,
    "v": lambda gpus: 2 * gpus,
    "roundrobin": lambda gpus: gpus,
}


def _profile(shape: TransformerShape, head_shards: int = 1):
    return analytic_profile(shape, RTX_4090, seq_len=SEQ_LEN, loss_chunk_tokens=4096, lm_head_shards=head_shards)


def _sizes(partition) -> str:
    text = " ".join(str(s) for s in partition.sizes)
    if partition.backward is not None:
        text += " / bwd " + " ".join(str(s) for s in partition.backward.sizes)
    return text


def method_table() -> tuple[list[str], list[str]]:
    lines = [
        "| model | GPUs | method | layers per stage | slowest (ms) | ideal (ms) | slowest / ideal | floor | time (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for shape in SHAPES:
        profile = _profile(shape)
        free = profile.with_(link_bandwidth=None)
        for gpus in GPUS:
            floor = cut(free, num_stages=gpus, method="dp").ratio
            results = {}
            for method, stages in METHODS.items():
                start = time.perf_counter()
                part = cut(profile, num_stages=stages(gpus), method=method)
                elapsed = time.perf_counter() - start
                results[method] = part
                lines.append(
                    f"| {shape.name} | {gpus} | {method} | {_sizes(part)} | {part.bottleneck:.1f} | "
                    f"{part.ideal:.1f} | {part.ratio:.4f} | {floor:.4f} | {elapsed:.2f} |"
                )
            dp, band = results["dp"], results["greedy-band"]
            verdicts.append(
                f"- {shape.name}, {gpus} GPUs: dp {dp.ratio:.4f} vs greedy-band {band.ratio:.4f} "
                f"({'never worse' if dp.bottleneck <= band.bottleneck * (1 + 1e-12) else 'WORSE'}); "
                f"within 2% of ideal: {'yes' if dp.ratio <= 1.02 else 'no'}; the layer sizes allow "
                f"{floor:.4f} at best (heaviest layer alone {_heaviest(profile, gpus):.4f}), dp is "
                f"{100 * (dp.ratio / floor - 1):.2f}% above that (the transfers at its cuts)"
            )
    return lines, verdicts


def _heaviest(profile, gpus: int) -> float:
    return max(layer.train_time for layer in profile.layers) / (profile.total_train_time / gpus)


def head_table() -> list[str]:
    """What slicing the LM head into vocabulary shards would buy the DP (cost model only)."""
    lines = ["| model | GPUs | head slices | dp slowest / ideal | floor |", "|---|---|---|---|---|"]
    for shape in SHAPES:
        for gpus in GPUS:
            for shards in (1, 2, 4):
                profile = _profile(shape, shards)
                dp = cut(profile, num_stages=gpus, method="dp")
                floor = cut(profile.with_(link_bandwidth=None), num_stages=gpus, method="dp").ratio
                lines.append(f"| {shape.name} | {gpus} | {shards} | {dp.ratio:.4f} | {floor:.4f} |")
    return lines


def layer_table() -> list[str]:
    lines = ["| model | embed F+I+W (ms) | decoder layer F+I+W (ms) | LM head F+I+W (ms) | head / layer |",
             "|---|---|---|---|---|"]
    for shape in SHAPES:
        p = _profile(shape)
        embed, layer, head = p.layers[0].train_time, p.layers[1].train_time, p.layers[-1].train_time
        lines.append(f"| {shape.name} | {embed:.2f} | {layer:.2f} | {head:.2f} | {head / layer:.2f} |")
    return lines


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report() -> str:
    methods, verdicts = method_table()
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return "\n".join([
        "# Partition quality: slowest stage over ideal on Qwen3 shapes",
        "",
        "Generated by `python bench/partition/quality.py`; do not edit by hand.",
        "",
        f"Run {now} on {platform.platform()}, Python {platform.python_version()}; bubbleless-partition "
        f"{bubbleless_partition.__version__} at commit {_commit()}. Profiles are analytic (no GPU was used): "
        f"{RTX_4090.name}, {RTX_4090.peak_tflops} TFLOPS x {RTX_4090.efficiency} efficiency, "
        f"{RTX_4090.memory_bandwidth} GB/s memory, {RTX_4090.link_bandwidth} GB/s between GPUs; "
        f"one micro-batch of {SEQ_LEN} tokens, bf16, loss in 4096-token chunks. Times are per micro-batch.",
        "",
        "### Per-layer costs",
        "",
        *layer_table(),
        "",
        "### Methods",
        "",
        "V: two chunks per GPU (rank r holds chunks r and 2p-1-r), slowest GPU's two chunks together. "
        "roundrobin: forward groups / backward groups (the last group of each is the same fused job); its "
        "ratio is the slowest job over the mean job, not over a per-GPU ideal. floor: the best contiguous "
        "cut with free transfers.",
        "",
        *methods,
        "",
        "### Goals",
        "",
        *verdicts,
        "",
        "### Slicing the LM head (cost model only: the runtime has no vocabulary-sliced head)",
        "",
        "The head as 1, 2 or 4 vocabulary slices on consecutive stages, passing the hidden state and a "
        "running softmax (max, sum, target logit) along; the DP cuts the result.",
        "",
        *head_table(),
        "",
    ])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS), help="markdown file to write, or - to print only")
    args = parser.parse_args(argv)
    text = report()
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
