"""What the backward split costs: I + W (deferred weight-gradient closures) against one full backward.

    python bench/runtime/split_cost.py [--width 256] [--tokens 1024] [--layers 4] [--repeats 15]

Model: a stack of pre-norm MLP blocks (LayerNorm, Linear d->4d, GELU, Linear 4d->d, residual), the
linear-heavy shape of a transformer layer. Each repeat times, interleaved so machine load hits both
alike: plain forward, plain backward; forward under ``defer_weight_grads``, I (autograd backward),
W (the queued closures). Prints medians and the ratios; the goal is split backward / full backward
<= 1.10.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from bubbleless_runtime import defer_weight_grads, run_weight_grads


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
    x = torch.randn(tokens, width, requires_grad=True)
    grad = torch.randn(tokens, width)
    times = {"forward": [], "backward": [], "forward_deferred": [], "I": [], "W": []}
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
        if i >= 2:  # warm-up
            for key, value in zip(times, (t1 - t0, t2 - t1, t4 - t3, t5 - t4, t6 - t5), strict=True):
                value_ms = value * 1e3
                times[key].append(value_ms)
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    m = measure(args.width, args.tokens, args.layers, args.repeats)
    split = m["I"] + m["W"]
    print(f"torch {torch.__version__}, {args.threads} thread(s), width {args.width}, tokens {args.tokens}, "
          f"{args.layers} blocks, median of {args.repeats} (ms)")
    print(f"full backward      {m['backward']:8.2f}")
    print(f"I (input grads)    {m['I']:8.2f}")
    print(f"W (weight grads)   {m['W']:8.2f}")
    print(f"split ratio (I+W)/B  {split / m['backward']:.3f}   (goal <= 1.10)")
    print(f"forward overhead of the deferral mode  {m['forward_deferred'] / m['forward']:.3f}")
    print(f"step ratio (F'+I+W)/(F+B)  {(m['forward_deferred'] + split) / (m['forward'] + m['backward']):.3f}")


if __name__ == "__main__":
    main()
