"""What the backward split costs: I + W against one full backward, two ways, under two allocators.

    python bench/runtime/split_cost.py [--width 256] [--tokens 1024] [--layers 4] [--repeats 15]

Model: a stack of pre-norm MLP blocks (LayerNorm, Linear d->4d, GELU, Linear 4d->d, residual), the
linear-heavy shape of a transformer layer. Each repeat times, interleaved so machine load hits all
alike: plain forward and backward; the runtime's split (forward under ``defer_weight_grads``, I as one
autograd backward, W the queued closures); and the graph split the runtime did not choose
(``autograd.grad`` for the input with ``retain_graph``, then ``autograd.grad`` for the parameters).
The goal is split backward / full backward <= 1.10.

Then the same measurement runs again in a child process whose glibc allocator keeps freed memory
(``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``, what PyTorch's CPU tuning guide gets from
jemalloc/tcmalloc): the split keeps each micro-batch's output gradients alive until W, so with glibc's
defaults I touches fresh pages that a plain backward would have reused. GPU caching allocators reuse
blocks the same way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
from record import write_section
from torch import nn

from bubbleless_runtime import defer_weight_grads, run_weight_grads

KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def block(width: int) -> nn.Module:
    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


class Residual(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


def measure(width: int, tokens: int, layers: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[Residual(block(width)) for _ in range(layers)])
    params = list(model.parameters())
    x = torch.randn(tokens, width, requires_grad=True)
    grad = torch.randn(tokens, width)
    keys = ("forward", "backward", "forward_deferred", "I", "W", "I_graph", "W_graph")
    times = {key: [] for key in keys}
    for i in range(repeats + 2):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        out = model(x)
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        queue: list = []
        t3 = time.perf_counter()
        with defer_weight_grads(queue):
            out = model(x)
        t4 = time.perf_counter()
        out.backward(grad)
        t5 = time.perf_counter()
        run_weight_grads(queue)
        t6 = time.perf_counter()
        out = model(x)
        t7 = time.perf_counter()
        torch.autograd.grad(out, x, grad, retain_graph=True)
        t8 = time.perf_counter()
        torch.autograd.grad(out, params, grad)
        t9 = time.perf_counter()
        if i >= 2:  # warm-up
            spans = (t1 - t0, t2 - t1, t4 - t3, t5 - t4, t6 - t5, t8 - t7, t9 - t8)
            for key, seconds in zip(keys, spans, strict=True):
                times[key].append(seconds * 1e3)
    return {key: statistics.median(values) for key, values in times.items()}


def rows(m: dict) -> dict[str, float]:
    split = m["I"] + m["W"]
    return {
        "full backward B (ms)": m["backward"],
        "I, input gradients (ms)": m["I"],
        "W, weight gradients (ms)": m["W"],
        "split ratio (I+W)/B (goal <= 1.10)": split / m["backward"],
        "forward with the deferral mode on / plain forward": m["forward_deferred"] / m["forward"],
        "step ratio (F'+I+W)/(F+B)": (m["forward_deferred"] + split) / (m["forward"] + m["backward"]),
        "graph split ratio (I+W)/B, not chosen": (m["I_graph"] + m["W_graph"]) / m["backward"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results/runtime.md", help="markdown record ('' to skip)")
    parser.add_argument("--json", action="store_true", help="print only the measurement as JSON (child run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = ["--width", str(args.width), "--tokens", str(args.tokens), "--layers", str(args.layers),
             "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if args.json:
        print(json.dumps(measure(args.width, args.tokens, args.layers, args.repeats)))
        return
    default = rows(measure(args.width, args.tokens, args.layers, args.repeats))
    child = subprocess.run([sys.executable, __file__, "--json", *shape], env={**os.environ, **KEEP_FREED_MEMORY},
                           capture_output=True, text=True, check=True)
    kept = rows(json.loads(child.stdout))
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), width {args.width}, tokens {args.tokens}, "
        f"{args.layers} blocks, median of {args.repeats} (ms)",
        "",
        "| quantity | glibc defaults | allocator keeps freed memory |",
        "|---|---|---|",
    ]
    for name in default:
        lines.append(f"| {name} | {default[name]:.3f} | {kept[name]:.3f} |")
    print("\n".join(lines))
    if args.out:
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        header = (
            "## Cost of the backward split (I + W against a plain backward)\n\n"
            f"Generated by `python bench/runtime/split_cost.py` on {stamp}, {platform.platform()}, "
            f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.2f}).\n\n"
        )
        footer = (
            "\n\nThe right column reruns the same measurement in a process whose glibc allocator keeps freed "
            "memory (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`): the split holds each output gradient "
            "until W, so under glibc's defaults I writes to fresh pages a plain backward would have reused. "
            "The graph split (`autograd.grad` twice, `retain_graph`) is what the runtime did not choose."
        )
        write_section(args.out, "split-cost", header + "\n".join(lines) + footer)


if __name__ == "__main__":
    main()
