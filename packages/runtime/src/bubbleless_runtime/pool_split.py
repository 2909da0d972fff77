"""The device pool's split backward: I gives the input gradient now, W the weight gradients later.

A round-robin schedule made with ``split_backward`` runs a gradient job's micro-batch as R (or the fused
last group's F), I, then W on the same device, W wherever the device would otherwise wait. The pool uses
the stage-bound executor's machinery (``split_backward``): the micro-batch's forward with a graph runs
under ``defer_weight_grads``, so every linear layer with a trainable leaf weight queues its ``g^T x``
for W instead of computing it in I. Frozen weights (a LoRA base) queue nothing: their linears only pass
the input gradient on, and only the adapters' weights wait for W. The other trainable tensors (norms,
embeddings) get their gradient in I, as in the stage-bound executor.

Memory: between I and W the queued closures keep each deferred linear's input ``x`` and output gradient
``g`` on the device. ``Deferred`` counts them on the device's ``MemoryBudget``: the forward notes (by
weak reference) every storage autograd saves and every gradient reaching a linear's output; once I has
run and dropped its graph, the noted storages still alive are what the queue holds (each storage once),
and those bytes stay reserved until W runs the queue and drops it. This counts what W really holds,
not an estimate, and needs nothing of ``split_backward`` but its public API.

The last group's last layer (the LM head) runs outside the deferral, fused (``fused_head_backward``: head
and loss forward and backward chunk by chunk) or not: queuing its weight gradient would keep the logits'
gradient (tokens x vocabulary) until W, which the plan's memory estimate does not count and the fused
head's chunking exists to avoid.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from .split_backward import WeightGradQueue, defer_weight_grads, run_weight_grads


class _NotingDeferral(defer_weight_grads):
    """``defer_weight_grads`` that also notes the gradient reaching each deferred linear's output (the
    ``g`` a queued weight gradient keeps), for ``Deferred.hold``."""

    def __init__(self, deferred: Deferred) -> None:
        super().__init__(deferred.queue)
        self.deferred = deferred

    def keeps(self, grad_out: torch.Tensor) -> None:
        self.deferred.note(grad_out)


@dataclass(eq=False)
class Deferred:
    """One micro-batch's deferred weight gradients on a device: the queue W runs, and its bytes."""

    queue: WeightGradQueue = field(default_factory=list)
    noted: list = field(default_factory=list)
    """Weak references to device storages the forward saved and the gradients its linears received."""
    held: int = 0
    """Bytes reserved on the budget from the end of I until W (``hold``)."""
    input_done: bool = False
    """Whether I has run (W may then run the queue)."""

    def deferral(self) -> _NotingDeferral:
        """The context the micro-batch's forward with a graph runs in."""
        return _NotingDeferral(self)

    def note(self, tensor: torch.Tensor) -> None:
        """Remember ``tensor``'s storage (weakly) as one W may keep. Also a gradient hook (returns None)."""
        self.noted.append(weakref.ref(tensor.untyped_storage()))

    def hold(self, budget, what: str) -> int:
        """After I: reserve the bytes of the noted storages still alive (what the queue keeps); returns them."""
        alive = self.alive_bytes()
        self.noted.clear()
        budget.reserve(alive, what)
        self.held, self.input_done = alive, True
        return self.held

    def alive_bytes(self) -> int:
        """Bytes of the noted storages still alive, each storage once."""
        alive = {}
        for ref in self.noted:
            storage = ref()
            if storage is not None:
                alive[storage.data_ptr()] = storage.nbytes()
        return sum(alive.values())

    def run(self, budget) -> None:
        """W: the queued weight gradients, then the bytes they held go back to the budget."""
        run_weight_grads(self.queue)
        self.drop(budget)

    def drop(self, budget) -> None:
        """Forget the queue unrun (a failed step) and give back what it held."""
        self.queue.clear()
        self.noted.clear()
        budget.free(self.held)
        self.held = 0
