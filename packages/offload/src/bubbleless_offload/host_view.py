"""``HostView``: which host tensors one iteration uploads its weights from and adds its gradients into.

A step run alone reads the callers' parameters (the front working weights) and adds into the front
accumulators, what ``DeviceWeights`` does with no view. When two iterations run at once (the
round-robin pool overlapping step k + 1's first jobs with step k's last, over the one-step-stale
optimizer's two buffer sets, ``HostStore.double_buffer``), each needs its own: step k reads the front
weights and adds into the front accumulators while step k + 1 reads the weights the optimizer thread
wrote into the back buffers and adds into the spare accumulators. A view holds the tensors themselves,
taken when the iteration is planned, so a ``swap_working``/``swap_grads`` (pointer swaps) meanwhile
changes nothing it reads or writes. Frozen parameters, buffers, and any parameter it does not name,
are read from the caller's parameter as without a view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .host_store import HostParam, HostStore

__all__ = ["HostView"]


@dataclass(frozen=True, eq=False)
class HostView:
    """Per trainable parameter (keyed by ``id`` of its ``HostParam``): the working weights to upload and the
    fp32 accumulator to add into."""

    working: Mapping[int, torch.Tensor]
    grads: Mapping[int, torch.Tensor]

    @classmethod
    def front(cls, store: HostStore) -> HostView:
        """The callers' parameters and the front accumulators, as they are now."""
        return cls({id(hp): hp.param.data for hp in store.trainable}, {id(hp): hp.grad for hp in store.trainable})

    @classmethod
    def back(cls, store: HostStore) -> HostView:
        """The back working buffers and the spare accumulators, as they are now (``double_buffer`` first)."""
        store.check_double_buffered()
        return cls({id(hp): hp.spare_working for hp in store.trainable},
                   {id(hp): hp.spare_grad for hp in store.trainable})

    def with_working_of(self, other: HostView) -> HostView:
        """These accumulators with ``other``'s working weights (an iteration reading the same weights)."""
        return HostView(other.working, self.grads)

    def working_of(self, hp: HostParam) -> torch.Tensor:
        return self.working.get(id(hp), hp.param.data)

    def grad_of(self, hp: HostParam) -> torch.Tensor:
        return self.grads[id(hp)]

    def zero_grads(self) -> None:
        """Zero this view's accumulators (an iteration that failed: its gradients are dropped)."""
        for grad in self.grads.values():
            grad.zero_()
