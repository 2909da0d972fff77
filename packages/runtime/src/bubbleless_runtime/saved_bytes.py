"""How many bytes of activations a process holds for backward, counted by autograd's own hooks.

    with SavedBytes() as saved:
        loss = pipe.step(inputs, targets)
    saved.peak, saved.live   # bytes: the most alive at once, and what is still alive

A storage counts from the first time autograd saves a tensor on it (``saved_tensors_hooks``) until the
storage itself dies: a weak reference to torch's storage object, which lives as long as any tensor or
view on it does. So what outlives the graph counts too, such as the layer inputs a deferred weight
gradient keeps after I (until W drops them), and each storage counts once however many views of it
were saved. Parameters and views of them are not counted (a linear saves its weight's transpose). Only this thread's
autograd is seen (the hooks are thread-local), and only saved tensors: weights, gradients, optimizer
state and transfer buffers are not.

The pool's device budget (``pool_worker``) counts the same storages its own way, per forward and on its
device only; the partition profiler (``bubbleless_partition.measure``) counts otherwise, weights included
(see its docstring).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch


class SavedBytes:
    """A context manager that counts live bytes of saved-for-backward storages (``live``, ``peak``).

    ``on_save``: called after each saved tensor is counted (``bench.measured.memory`` samples the
    allocator there). ``peak`` can be reset between phases (``saved.peak = saved.live``)."""

    def __init__(self, on_save: Callable[[], None] | None = None) -> None:
        self.sizes: dict[int, int] = {}  # storage data pointer -> bytes, for the storages alive
        self.live = self.peak = 0
        self.on_save = on_save
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        return False

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t if t._base is None else t._base, torch.nn.Parameter):
            return t.detach()  # a weight or a view of one (a norm's weight, a linear's transpose): no activation
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size and key not in self.sizes:
            self.sizes[key] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key)
        if self.on_save is not None:
            self.on_save()
        # A detached alias, not ``t``: an output saved for its own backward (exp, tanh, softmax) would
        # otherwise hold its grad_fn that holds it, a cycle even the garbage collector leaves alone.
        return t.detach()

    def _release(self, key: int) -> None:
        self.live -= self.sizes.pop(key)


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
