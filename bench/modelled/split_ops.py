"""What the runtime's backward split costs on this CPU at the calibration scenario's sizes: the ratios the
stage-bound model scales a split stage's F, I and W by on a measured ``cpu`` profile (``ours.stage_bound``).

    python -m bench.modelled.split_ops      # measures, writes the ``split_backward`` entry of cpu_ops.yaml

A schedule with separate I and W actions (ZB-V, ZB) runs each such micro-batch's forward under
``bubbleless_runtime.defer_weight_grads`` (``executor.forward``: every ``Linear`` keeps its input and
queues its weight gradient), then I as one autograd backward and W as the queued closures
(``run_weight_grads``). The cost model prices I and W at the GEMM rates as if splitting were free; here
the split is timed against the plain forward and backward on a stack of the measured model's decoder
layers (``bench.measured.tiny.DecoderLayer``), by the timing thread's CPU time, the two ways back to
back in an order that alternates, the ratios the median of the per-repeat ratios (bench/runtime/
split_cost.py measures the same split by wall time for the runtime's record).

``python bench/model.py --measure-cpu`` keeps this entry as it is (``cpu_ops.MEASURED_APART``).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SplitBackward:
    """The runtime's split, measured (this module's docstring)."""

    forward_ratio: float
    """A forward under ``defer_weight_grads`` over a plain forward."""
    backward_ratio: float
    """I + W of the split over one plain backward B."""
    source: str = ""

    def __post_init__(self) -> None:
        if not all(0 < ratio < math.inf for ratio in (self.forward_ratio, self.backward_ratio)):
            raise ValueError(f"SplitBackward ratios must be finite positive numbers, got {self!r}")


def measure_split_backward(*, tokens: int = 256, hidden: int = 256, intermediate: int = 768, heads: int = 4,
                           layers: int = 6, repeats: int = 31) -> SplitBackward:
    """Time the split against the plain pass on the calling thread (set torch's threads first)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"measure_split_backward repeats must be a positive int (paired repeats to take the "
                         f"median of, e.g. 31), got {repeats!r}")
    import torch
    from torch import nn

    from bench.measured.scenario import TinyShape
    from bench.measured.tiny import DecoderLayer
    from bubbleless_runtime import defer_weight_grads, run_weight_grads

    shape = TinyShape(layers=layers, hidden=hidden, heads=heads, intermediate=intermediate, vocab=2)
    torch.manual_seed(0)
    model = nn.Sequential(*(DecoderLayer(shape) for _ in range(layers)))
    x, grad = torch.randn(1, tokens, hidden, requires_grad=True), torch.randn(1, tokens, hidden)

    def plain() -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        t0 = time.thread_time()
        out = model(x)
        t1 = time.thread_time()
        out.backward(grad)
        return t1 - t0, time.thread_time() - t1

    def split() -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        queue: list = []
        t0 = time.thread_time()
        with defer_weight_grads(queue):
            out = model(x)
        t1 = time.thread_time()
        out.backward(grad)
        run_weight_grads(queue)
        return t1 - t0, time.thread_time() - t1

    forward, backward = [], []
    for i in range(repeats + 2):
        first, second = (plain, split) if i % 2 else (split, plain)
        a, b = first(), second()
        (p, s) = (a, b) if first is plain else (b, a)
        if i >= 2:  # warm-up
            forward.append(s[0] / p[0])
            backward.append(s[1] / p[1])
    return SplitBackward(
        forward_ratio=float(f"{statistics.median(forward):.4g}"),
        backward_ratio=float(f"{statistics.median(backward):.4g}"),
        source=f"thread CPU time, median of {repeats} paired repeats (plain and split back to back, order "
               f"alternating), fp32, {torch.get_num_threads()} thread(s), {layers} tiny decoder layers, {tokens} "
               f"tokens, hidden {hidden}, MLP {intermediate}, {heads} heads: defer_weight_grads forward over the "
               f"plain forward, backward + run_weight_grads over the plain backward")


def split_backward_to_dict(split: SplitBackward) -> dict:
    return {"value": [split.forward_ratio, split.backward_ratio], "source": split.source}


def split_backward_from_dict(data: dict) -> SplitBackward:
    try:
        forward, backward = data["value"]
        return SplitBackward(forward_ratio=float(forward), backward_ratio=float(backward), source=data["source"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"a split_backward entry needs {{value: [forward ratio, backward ratio], source}}: "
                         f"{error}") from error


def main() -> None:
    from .ops_entry import write_ops_entry

    write_ops_entry("split_backward", lambda: split_backward_to_dict(measure_split_backward()))


if __name__ == "__main__":
    main()
