"""What the backward split costs: I + W against one full backward, three ways, under two allocators.

    python bench/runtime/split_cost.py [--block mlp|decoder] [--width 256] [--tokens 1024] [--layers 4]
                                       [--repeats 15]

Model: a stack of ``--block`` blocks: ``mlp`` pre-norm MLP blocks (LayerNorm, Linear d->4d, GELU,
Linear 4d->d, residual), the linear-heavy shape of a transformer layer; ``decoder`` the measured
scenario's decoder layer (``bench.measured.tiny.DecoderLayer``: attention and SwiGLU MLP, ``width/64``
heads, intermediate ``3 width``). Each repeat times, in an order rotated from repeat to repeat so
machine load hits all alike: plain forward and backward; the runtime's split (forward under
``defer_weight_grads``, I as one autograd backward, W the queued closures); the same closures behind an
all-ops ``TorchFunctionMode`` (``AllOpsDeferral``, the runtime's previous deferral: every torch op of
the forward goes through Python); and the graph split the runtime did not choose (``autograd.grad`` for
the input with ``retain_graph``, then ``autograd.grad`` for the parameters). Ratios are the median of
the per-repeat ratios (each repeat times every variant back to back). The goal is split backward /
full backward <= 1.10.

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
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.measured's layer
from bench.measured.scenario import TinyShape  # noqa: E402
from bench.measured.tiny import DecoderLayer  # noqa: E402
from bench.runtime.record import write_section  # noqa: E402
from bench.strict_json import dumps  # noqa: E402
from bubbleless_runtime import defer_weight_grads, run_weight_grads  # noqa: E402
from bubbleless_runtime.split_backward import _deferrable, _DeferredLinear  # noqa: E402

KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


class AllOpsDeferral(TorchFunctionMode, defer_weight_grads):
    """The runtime's previous deferral, kept here as the yardstick: a ``TorchFunctionMode`` that sees
    every torch op of the forward and sends ``F.linear`` with trainable leaf weights to the same
    ``_DeferredLinear`` the runtime uses now; only how linears are found differs."""

    def __init__(self, queue: list) -> None:
        TorchFunctionMode.__init__(self)
        defer_weight_grads.__init__(self, queue)

    __enter__, __exit__ = TorchFunctionMode.__enter__, TorchFunctionMode.__exit__

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if _deferrable(weight, bias):
                return _DeferredLinear.apply(x, weight, bias, self)
        return func(*args, **kwargs)


def block(width: int) -> nn.Module:
    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


class Residual(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


BLOCKS = {
    "mlp": lambda width: Residual(block(width)),
    "decoder": lambda width: DecoderLayer(TinyShape(layers=1, hidden=width, heads=max(1, width // 64),
                                                    intermediate=3 * width, vocab=2)),
}
"""``--block`` -> a function of the width building one block."""

VARIANTS = ("plain", "deferred", "all_ops", "graph")


def one_variant(variant: str, model: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[float, float, float]:
    """(forward, I or B, W) seconds of one forward and backward of ``model`` the ``variant`` way."""
    model.zero_grad(set_to_none=True)
    queue: list = []
    deferral = {"deferred": defer_weight_grads, "all_ops": AllOpsDeferral}.get(variant)
    t0 = time.perf_counter()
    if deferral is None:
        out = model(x)
    else:
        with deferral(queue):
            out = model(x)
    t1 = time.perf_counter()
    if variant == "graph":
        torch.autograd.grad(out, x, grad, retain_graph=True)
        t2 = time.perf_counter()
        torch.autograd.grad(out, list(model.parameters()), grad)
    else:
        out.backward(grad)
        t2 = time.perf_counter()
        run_weight_grads(queue)
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def measure(block_name: str, width: int, tokens: int, layers: int, repeats: int) -> dict:
    """Per variant, per repeat: (forward, I or B, W) in ms, the variants' order rotated every repeat."""
    torch.manual_seed(0)
    model = nn.Sequential(*[BLOCKS[block_name](width) for _ in range(layers)])
    x = torch.randn(1, tokens, width, requires_grad=True)
    grad = torch.randn(1, tokens, width)
    times: dict[str, list] = {v: [] for v in VARIANTS}
    for i in range(repeats + 2):
        order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
        spans = {v: one_variant(v, model, x, grad) for v in order}
        if i >= 2:  # warm-up
            for v in VARIANTS:
                times[v].append([seconds * 1e3 for seconds in spans[v]])
    return times


def rows(times: dict) -> dict[str, float]:
    def median(variant: str, part: int) -> float:
        return statistics.median(t[part] for t in times[variant])

    def paired(variant: str, parts: tuple[int, ...], base_parts: tuple[int, ...]) -> float:
        return statistics.median(sum(t[p] for p in parts) / sum(b[p] for p in base_parts)
                                 for t, b in zip(times[variant], times["plain"], strict=True))

    return {
        "plain forward F (ms)": median("plain", 0),
        "full backward B (ms)": median("plain", 1),
        "I, input gradients (ms)": median("deferred", 1),
        "W, weight gradients (ms)": median("deferred", 2),
        "split ratio (I+W)/B (goal <= 1.10)": paired("deferred", (1, 2), (1,)),
        "forward under the deferral / plain forward": paired("deferred", (0,), (0,)),
        "forward under the all-ops mode (previous deferral) / plain forward": paired("all_ops", (0,), (0,)),
        "step ratio (F'+I+W)/(F+B)": paired("deferred", (0, 1, 2), (0, 1)),
        "step ratio under the all-ops mode": paired("all_ops", (0, 1, 2), (0, 1)),
        "graph split ratio (I+W)/B, not chosen": paired("graph", (1, 2), (1,)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", choices=sorted(BLOCKS), default="mlp")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="bench/results/runtime.md", help="markdown record ('' to skip)")
    parser.add_argument("--json", action="store_true", help="print only the measurement as JSON (child run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = ["--block", args.block, "--width", str(args.width), "--tokens", str(args.tokens), "--layers", str(args.layers),
             "--repeats", str(args.repeats), "--threads", str(args.threads)]
    if args.json:
        print(dumps(measure(args.block, args.width, args.tokens, args.layers, args.repeats)))
        return
    default = rows(measure(args.block, args.width, args.tokens, args.layers, args.repeats))
    child = subprocess.run([sys.executable, __file__, "--json", *shape], env={**os.environ, **KEEP_FREED_MEMORY},
                           capture_output=True, text=True, check=True)
    kept = rows(json.loads(child.stdout))
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), width {args.width}, tokens {args.tokens}, "
        f"{args.layers} {args.block} blocks, median of {args.repeats} (ms; ratios: median of per-repeat ratios)",
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
            "The all-ops mode is the runtime's previous deferral (a `TorchFunctionMode`: every op of the forward "
            "through Python); the graph split (`autograd.grad` twice, `retain_graph`) is what the runtime did not choose."
        )
        write_section(args.out, "split-cost", header + "\n".join(lines) + footer)


if __name__ == "__main__":
    main()
