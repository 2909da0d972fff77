"""The backward split: I computes input gradients now, W computes weight gradients later.

Choice: **deferred weight-gradient closures for ``nn.Linear`` layers**, not a split of the autograd graph.

- While a micro-batch's forward runs under ``defer_weight_grads(queue)``, every ``nn.Linear`` (and
  subclass that keeps its ``forward``) whose trainable weights are leaf parameters runs through
  ``_DeferredLinear``. Its backward returns only the input gradient and appends a closure
  ``grad_w += g^T x`` (and the bias sum) to ``queue``. I is then one ordinary
  ``torch.autograd.backward``; W runs the queued closures.
- Why closures: the weight-gradient GEMM is exactly the work W is meant to move, and a closure costs
  one saved reference to ``x`` and ``g`` and no extra graph traversal. Splitting the autograd graph
  instead (``autograd.grad`` on inputs with ``retain_graph`` and on the parameters later) walks the graph
  twice and keeps every saved activation until W. ``bench/runtime/split_cost.py`` measures both against
  one full backward on CPU.
- How linears are found: ``nn.Linear.forward`` is swapped, while at least one deferral is open in the
  process, for ``_linear_forward``, which defers when *this thread* is inside a deferral and otherwise
  calls torch's own forward. Only linear layers pay anything (one thread-local look-up when not
  deferring), and with no deferral open ``nn.Linear`` is torch's again. The previous design, a
  ``TorchFunctionMode``, sent every torch op of the forward through Python ``__torch_function__`` and
  made the deferred forward 5-10% slower than a plain one (the split-cost bench compares the two).
  Thread-local: the device pool runs one worker thread per device, some deferring, some not.
- Everything else gets its gradient during I, from the same backward pass: norm weights, embeddings,
  weights that are not leaves (tied or sliced expert tensors, parametrizations), ``F.linear`` called
  outside an ``nn.Linear``, and subclasses that override ``forward``. They are a small share of the
  FLOPs of a transformer (LoRA's adapters and a model's projections are ``nn.Linear`` modules), so W
  keeps almost all of the weight-gradient work; the gradients are exact either way, only their timing
  differs.

Mixed precision: under autocast the forward runs in the autocast dtype; the backward computes in the
gradient's dtype and casts each result to the dtype of the tensor it belongs to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

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
    def forward(ctx, x, weight, bias, deferral):
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias, ctx.deferral = weight, bias, deferral
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

        ctx.deferral.keeps(g)
        ctx.deferral.queue.append(weight_grad)
        return grad_x, None, None, None


def _deferrable(weight, bias) -> bool:
    trainable = [t for t in (weight, bias) if t is not None and t.requires_grad]
    return torch.is_grad_enabled() and bool(trainable) and all(t.is_leaf for t in trainable)


class _ThisThread(threading.local):
    """The deferrals open in the current thread, innermost last."""

    def __init__(self) -> None:
        self.open: list[defer_weight_grads] = []


class _LinearSwap:
    """``nn.Linear.forward`` replaced by ``_linear_forward`` while any thread has a deferral open.

    Process state by nature (a class attribute of torch's is what is swapped), kept on this one object:
    the number of open deferrals, torch's forward to restore, and each thread's open deferrals."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.torch_forward: Callable = nn.Linear.forward
        """What ``_linear_forward`` calls when its thread is not deferring; never cleared, so a thread that
        looked the swapped forward up just before the last deferral closed still finds it."""
        self.this_thread = _ThisThread()

    def acquire(self) -> None:
        with self.lock:
            current = nn.Linear.__dict__["forward"]
            if current is not _linear_forward:
                self.torch_forward = current
                nn.Linear.forward = _linear_forward
            self.users += 1

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                if nn.Linear.__dict__["forward"] is _linear_forward:  # nobody swapped it again since
                    nn.Linear.forward = self.torch_forward


_SWAP = _LinearSwap()
"""The one swap of the process (``nn.Linear`` is one class per process); it does nothing at import."""


def _linear_forward(self: nn.Linear, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's name
    deferrals = _SWAP.this_thread.open
    if deferrals and _deferrable(self.weight, self.bias):
        return deferrals[-1].linear(input, self.weight, self.bias)
    return _SWAP.torch_forward(self, input)


class defer_weight_grads:  # noqa: N801 - used like a function: with defer_weight_grads(q)
    """Inside this context (in this thread), ``nn.Linear`` layers with trainable leaf weights queue their
    weight gradient on ``queue``; see the module docstring for what else gets its gradient in I."""

    def __init__(self, queue: WeightGradQueue) -> None:
        self.queue = queue

    def __enter__(self) -> defer_weight_grads:
        _SWAP.acquire()
        _SWAP.this_thread.open.append(self)
        return self

    def __exit__(self, *exc) -> bool:
        _SWAP.this_thread.open.remove(self)
        _SWAP.release()
        return False

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """One deferred linear layer's forward."""
        return _DeferredLinear.apply(x, weight, bias, self)

    def keeps(self, grad_out: torch.Tensor) -> None:
        """Called with each output gradient a queued weight gradient keeps (during I); subclasses note it."""


def run_weight_grads(queue: WeightGradQueue) -> None:
    """W: run and drop the queued weight-gradient closures, each dropped (with the x and g it holds) as
    soon as it has run. Without grad mode: a gradient is a plain tensor, never a node of a graph."""
    with torch.no_grad():
        while queue:
            queue.pop(0)()
