"""The backward split: I computes input gradients now, W computes weight gradients later.

Choice: **deferred weight-gradient closures for linear layers**, not a split of the autograd graph.

- While a micro-batch's forward runs under ``defer_weight_grads(queue)``, every ``F.linear`` whose
  weight is a trainable leaf parameter runs through ``_DeferredLinear``. Its backward returns only the
  input gradient and appends a closure ``grad_w += g^T x`` (and the bias sum) to ``queue``. I is then one
  ordinary ``torch.autograd.backward``; W runs the queued closures.
- Why closures: the weight-gradient GEMM is exactly the work W is meant to move, and a closure costs
  one saved reference to ``x`` and ``g`` and no extra graph traversal. Splitting the autograd graph
  instead (``autograd.grad`` on inputs with ``retain_graph`` and on the parameters later) walks the graph
  twice. ``bench/runtime/split_cost.py`` measures both against one full backward on CPU: the graph
  split 1.5-1.6x, the closures 1.01x with an allocator that reuses freed memory (jemalloc, tcmalloc, or
  glibc told to keep it; GPU caching allocators behave so) and 1.05-1.12x under glibc's defaults, where
  I writes the input gradients to fresh pages because the output gradients W needs are still held.
- Everything else (norm weights, embeddings, weights that are not leaves such as tied or sliced
  expert tensors) gets its gradient during I, from the same backward pass. They are a small share of
  the FLOPs of a transformer, so W keeps almost all of the weight-gradient work; the gradients are
  exact either way, only their timing differs.
- A TorchFunctionMode, not module surgery: the caller's layers stay untouched (LoRA and any code that
  calls ``F.linear`` directly are covered), and the mode is active only inside this rank's forwards.

Mixed precision: under autocast the forward runs in the autocast dtype; the backward computes in the
gradient's dtype and casts each result to the dtype of the tensor it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

WeightGradQueue = list[Callable[[], None]]


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    grad = grad.to(param.dtype)
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class _DeferredLinear(torch.autograd.Function):
    """``F.linear`` whose backward gives the input gradient and queues the weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, queue):
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias, ctx.queue = weight, bias, queue
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        weight, bias = ctx.weight, ctx.bias
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_out.matmul(weight.to(grad_out.dtype)).to(x.dtype)

        # Detached: W runs outside autograd's backward, where grad mode is on; a ``g^T x`` of tensors
        # that carry history would record a graph on ``.grad`` and keep every micro-batch's x and g
        # alive through it until the gradients are dropped (``run_weight_grads`` also turns grad off).
        g, x = grad_out.detach(), x.detach()

        def weight_grad() -> None:
            g2 = g.reshape(-1, g.shape[-1])
            if weight.requires_grad:
                x2 = x.reshape(-1, x.shape[-1]).to(g2.dtype)
                grad = weight.grad
                if grad is not None and grad.dtype == g2.dtype and grad.is_contiguous():
                    # Accumulate in place: a fresh weight-sized temporary per W makes W times uneven
                    # (new pages each time), which the simulator then cannot predict.
                    grad.addmm_(g2.t(), x2)
                else:
                    _accumulate(weight, g2.t().matmul(x2))
            if bias is not None and bias.requires_grad:
                _accumulate(bias, g2.sum(0))

        ctx.queue.append(weight_grad)
        return grad_x, None, None, None


def _deferrable(weight, bias) -> bool:
    trainable = [t for t in (weight, bias) if t is not None and t.requires_grad]
    return torch.is_grad_enabled() and bool(trainable) and all(t.is_leaf for t in trainable)


class defer_weight_grads(TorchFunctionMode):  # noqa: N801 - used like a function: with defer_weight_grads(q)
    """Inside this context, linear layers with trainable leaf weights queue their weight gradient."""

    def __init__(self, queue: WeightGradQueue) -> None:
        super().__init__()
        self.queue = queue

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if _deferrable(weight, bias):
                return _DeferredLinear.apply(x, weight, bias, self.queue)
        return func(*args, **kwargs)


def run_weight_grads(queue: WeightGradQueue) -> None:
    """W: run and drop the queued weight-gradient closures, each dropped (with the x and g it holds) as
    soon as it has run. Without grad mode: a gradient is a plain tensor, never a node of a graph."""
    with torch.no_grad():
        while queue:
            queue.pop(0)()
