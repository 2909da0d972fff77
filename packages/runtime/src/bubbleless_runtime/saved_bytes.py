"""How many bytes of activations a process holds for backward, counted by autograd's own hooks.

    with SavedBytes() as saved:
        loss = pipe.step(inputs, targets)
    saved.peak, saved.live   # bytes: the most alive at once, and what is still alive

The counting is the partition profiler's (``bubbleless_partition.saved_tensors.SavedStorages``, where
the rules are written): each saved storage once, from its first save until it dies, parameters and
views of them left out. So the layer profile that plans a cut (``activation_bytes_per_token``) and the
bytes tests/test_rt_memory.py bounds the executor by are the same count. Here it spans a whole step or
more, every device, and only this thread's autograd.

The pool's device budget (``pool_worker``) uses the same counter per forward, on its device only.
"""

from __future__ import annotations

from collections.abc import Callable

from bubbleless_partition.saved_tensors import SavedStorages


class SavedBytes(SavedStorages):
    """A context manager that counts live bytes of saved-for-backward storages (``live``, ``peak``).

    ``on_save``: called after each saved tensor is counted (``bench.measured.memory`` samples the
    allocator there). ``peak`` can be reset between phases (``saved.peak = saved.live``)."""

    def __init__(self, on_save: Callable[[], None] | None = None) -> None:
        super().__init__(on_save=None if on_save is None else (lambda _tensor, _added: on_save()))
