"""The bytes autograd keeps for backward, counted by its own hooks: each storage once, weights left out.

    with SavedStorages(excluded=layer.parameters()) as saved:
        y = layer(x)
        kept = saved.live   # bytes y's graph keeps alive for its backward

A storage counts from the first time autograd saves a tensor on it (``saved_tensors_hooks``) until the
storage itself dies: a weak reference to torch's storage object, which lives as long as any tensor or
view on it does. Storages, not saved tensors, because that is what memory holds: a tensor saved by two
ops (an input read by two linears) is one allocation and counts once, and a saved view counts its whole
storage, which it keeps alive. What outlives the graph counts too, such as the inputs a deferred weight
gradient keeps after I.

Parameters are not activations (they are a layer's ``param_bytes``, alive whatever the micro-batches):
a saved parameter, a view of one (a linear saves its weight's transpose) and any tensor on the storage
of a tensor in ``excluded`` (pass the layer's parameters and buffers: a tied weight, a rotary cache) are
left out. Only this thread's autograd is seen (the hooks are thread-local), and only saved tensors:
weights, gradients, optimizer state, transfer buffers and the scratch an op frees before it returns are
not.

torch is imported here: import this module where torch is wanted (the package imports it lazily).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch


class SavedStorages:
    """A context manager counting the storages autograd saves: ``live`` (bytes still alive), ``peak`` (the
    most alive at once; may be reset between phases, ``saved.peak = saved.live``), ``total`` (every
    storage counted, dead or alive).

    ``excluded``: tensors whose storages are not activations (parameters, buffers). ``device``: count
    only storages there (None: every device). ``on_save(tensor, new_bytes)``: called after each counted
    saved tensor, with the bytes its storage added (0 when already counted)."""

    def __init__(self, *, excluded: Iterable[torch.Tensor] = (), device: torch.device | None = None,
                 on_save: Callable[[torch.Tensor, int], None] | None = None) -> None:
        self.excluded = {_key(t.untyped_storage()) for t in excluded}
        self.device = device
        self.on_save = on_save
        self.sizes: dict[tuple, int] = {}  # (device, storage data pointer) -> bytes, for the storages alive
        self.live = self.peak = self.total = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> SavedStorages:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        return False

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # A detached alias, not ``t``: an output saved for its own backward (exp, tanh, softmax) would
        # otherwise hold its grad_fn that holds it, a cycle even the garbage collector leaves alone.
        alias = t.detach()
        if isinstance(t if t._base is None else t._base, torch.nn.Parameter):
            return alias
        if self.device is not None and t.device != self.device:
            return alias
        storage = t.untyped_storage()
        key, size = _key(storage), storage.nbytes()
        if key in self.excluded:
            return alias
        added = 0
        if size and key not in self.sizes:
            self.sizes[key] = added = size
            self.live += size
            self.total += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._release, key)
        if self.on_save is not None:
            self.on_save(t, added)
        return alias

    def _release(self, key: tuple) -> None:
        self.live -= self.sizes.pop(key)


def _key(storage) -> tuple:
    return storage.device, storage.data_ptr()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
