"""``HostStore``: a model's training state in host memory, per layer, for stateless device workers.

What each unique parameter has here (``HostParam``):

- working weights: the caller's own parameter tensor, in the training dtype. Devices upload these. With
  pinning on, their data is moved into page-locked buffers from a ``PinnedPool`` so uploads overlap
  compute (turn it off on machines with little RAM: pinned pages cannot be swapped).
- trainable parameters only: an fp32 master (the optimizer's copy; the caller's tensor itself when it is
  already fp32, so nothing is duplicated) and an fp32 gradient accumulator that device workers add into.
- frozen parameters (LoRA base weights): nothing else. They are never downloaded back, and can be
  memory-mapped from a .safetensors file instead of held in RAM (``frozen_safetensors``).
- after ``double_buffer()`` (the one-step-stale optimizer, ``host_optimizer_async``): trainable
  parameters also get a second accumulator and a second (back) working buffer, and a master of their own
  even when the working dtype is fp32, so an optimizer thread can step the masters and write the next
  working weights while devices read the current ones and add into the other accumulator.

Parameters are de-duplicated by identity: a tied embedding / LM-head weight used by the first and the
last layer is one ``HostParam`` with one master and one accumulator.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .grad_adds import GradientAdds
from .mmap_safetensors import map_frozen
from .pinned_pool import PinnedPool
from .streams import current_stream, record_blocking

__all__ = ["STAGE_BYTES", "HostParam", "HostStore"]

STAGE_BYTES = 64 << 20
"""Device gradients a store stages on the host before one wait (``accumulate_all``): a job's worth of
per-parameter waits become a few, while the pinned staging a device holds at once stays bounded."""


@dataclass(eq=False, kw_only=True)
class HostParam:
    """The host-side state of one unique parameter (compared by identity)."""

    param: nn.Parameter
    """The caller's parameter; its data are the working weights devices upload."""
    name: str
    """The first qualified name it was seen under, ``"<layer index>.<name in the layer>"``."""
    trainable: bool
    """``param.requires_grad`` when the store was built."""
    master: torch.Tensor | None = None
    """fp32 master weights (the optimizer's); aliases ``param``'s data when that is fp32. None if frozen."""
    grad: torch.Tensor | None = None
    """fp32 gradient accumulator (zeroed by ``HostStore.zero_grad``). None if frozen."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while adding into ``grad``: device threads store gradients concurrently."""
    spare_grad: torch.Tensor | None = None
    """The second fp32 accumulator (``double_buffer``); swapped with ``grad`` by ``swap_grads``."""
    spare_working: torch.Tensor | None = None
    """The back working buffer (``double_buffer``): the next weights are written here, then swapped in."""

    @property
    def nbytes(self) -> int:
        """Bytes of the working weights (what one upload moves)."""
        return self.param.numel() * self.param.element_size()


class HostStore:
    """Host-resident state of ``layers`` (list index = layer index; the caller's own modules).

    ``pin_memory``: pin working weights (None: when ``torch.cuda.is_available()``, asked here, never at
    import). ``pool``: where pinned buffers come from (None: a new ``PinnedPool``; kept as ``store.pool``
    for gradient staging). ``frozen_safetensors``: a .safetensors file whose tensors replace the data of
    frozen parameters (memory-mapped, not pinned, never copied into RAM until read); the parameters may
    then be built on the ``meta`` device. ``safetensors_key``: maps a store name (``"3.linear.weight"``)
    to the file's key for it (None: the same name); frozen parameters whose key is missing keep their data.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        *,
        pin_memory: bool | None = None,
        pool: PinnedPool | None = None,
        frozen_safetensors: str | os.PathLike | None = None,
        safetensors_key: Callable[[str], str] | None = None,
    ) -> None:
        layers = list(layers)
        if not layers or not all(isinstance(layer, nn.Module) for layer in layers):
            raise ValueError("HostStore needs a non-empty sequence of nn.Module layers (one per layer index)")
        self.layers = layers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.pool = pool if pool is not None else PinnedPool(pin=self.pin_memory)
        self.adds = GradientAdds()
        """Gradient batches queued by ``accumulate_all(wait=False)``, added on a thread; every method here that
        reads or zeroes the accumulators waits for them first (``flush_adds``)."""
        self.drain: Callable[[], None] = _nothing
        """Called before ``master_state_dict``/``load_master_state_dict`` touch the masters: an asynchronous
        optimizer sets it to its ``synchronize``, so no update is in flight or pending then."""
        if self.pin_memory and not self.pool.pin:
            raise ValueError("pin_memory=True with an unpinned pool: pass PinnedPool(pin=True) or pin_memory=False")
        by_id: dict[int, HostParam] = {}
        self._layer_params: list[list[tuple[str, HostParam]]] = []
        self._layer_buffers: list[list[tuple[str, torch.Tensor]]] = []
        for index, layer in enumerate(layers):
            entries = []
            for local, p in layer.named_parameters(remove_duplicate=False):
                if id(p) not in by_id:
                    by_id[id(p)] = HostParam(param=p, name=f"{index}.{local}", trainable=p.requires_grad)
                entries.append((local, by_id[id(p)]))
            self._layer_params.append(entries)
        self.params: list[HostParam] = list(by_id.values())
        """Unique parameters in model order (first appearance)."""
        self.trainable: list[HostParam] = [hp for hp in self.params if hp.trainable]
        """The unique parameters with masters and gradient accumulators."""
        mapped = set() if frozen_safetensors is None else map_frozen(self.params, frozen_safetensors, safetensors_key)
        for hp in self.params:
            self._to_host(hp, pin=self.pin_memory and id(hp) not in mapped)
        on_host: dict[int, torch.Tensor] = {}  # buffers go to the host too (shared ones stay shared)
        for layer in layers:
            for module in layer.modules():
                for key, buffer in module._buffers.items():
                    if buffer is not None and buffer.device.type != "cpu":
                        if id(buffer) not in on_host:
                            on_host[id(buffer)] = buffer.cpu()
                        module._buffers[key] = on_host[id(buffer)]
        for layer in layers:
            named = layer.named_buffers(remove_duplicate=False)
            self._layer_buffers.append([(name, b) for name, b in named if b is not None])
        for hp in self.trainable:
            data = hp.param.data
            hp.master = data if data.dtype == torch.float32 else data.float()
            hp.grad = torch.zeros(data.shape, dtype=torch.float32)

    # ---- construction helpers ----

    def _to_host(self, hp: HostParam, *, pin: bool) -> None:
        data = hp.param.data
        if data.device.type == "meta":
            raise ValueError(
                f"parameter {hp.name} is on the meta device; load its values first, or for a frozen parameter "
                f"pass frozen_safetensors= with a file that holds it"
            )
        if data.device.type != "cpu":
            data = data.cpu()
        if pin and not data.is_pinned():
            pinned = self.pool.acquire(data.shape, data.dtype)
            pinned.copy_(data)
            data = pinned
        if data is not hp.param.data:
            hp.param.data = data

    # ---- what layers hold ----

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_params(self, index: int) -> list[tuple[str, HostParam]]:
        """``(name in the layer, HostParam)`` pairs of layer ``index``.

        In ``named_parameters(remove_duplicate=False)`` order: a parameter used twice appears twice."""
        return list(self._layer_params[self._check_layer(index)])

    def layer_buffers(self, index: int) -> list[tuple[str, torch.Tensor]]:
        """``(name in the layer, host tensor)`` for layer ``index``'s buffers, duplicates included."""
        return list(self._layer_buffers[self._check_layer(index)])

    def weight_bytes(self, layer_indices: Iterable[int]) -> int:
        """Bytes one job over these layers uploads: their params and buffers, each unique tensor once."""
        seen: dict[int, int] = {}
        for index in layer_indices:
            for _, hp in self.layer_params(index):
                seen[id(hp)] = hp.nbytes
            for _, buffer in self.layer_buffers(index):
                seen[id(buffer)] = buffer.numel() * buffer.element_size()
        return sum(seen.values())

    def grad_bytes(self, layer_indices: Iterable[int]) -> int:
        """Bytes of device gradients (working dtype) a job over these layers stores: trainable params, once each."""
        seen = {id(hp): hp.nbytes for i in layer_indices for _, hp in self.layer_params(i) if hp.trainable}
        return sum(seen.values())

    def _check_layer(self, index: int) -> int:
        if not 0 <= index < len(self.layers):
            raise ValueError(f"layer index {index} is out of range; this store has layers 0..{len(self.layers) - 1}")
        return index

    # ---- gradients ----

    def flush_adds(self) -> None:
        """Wait until every gradient batch queued so far is added; raise the first that failed (its step's
        sums are then incomplete: drop them with ``zero_grad``)."""
        self.adds.flush()

    def zero_grad(self) -> None:
        """Zero every gradient accumulator (after an optimizer step, before the next iteration, after a failed
        step): queued adds land first, and their errors are dropped with the sums."""
        self.adds.settle()
        for hp in self.trainable:
            with hp.lock:
                hp.grad.zero_()

    def accumulate(self, host_param: HostParam, device_grad: torch.Tensor, into: torch.Tensor | None = None) -> None:
        """Add ``device_grad`` (any device, any float dtype) into ``host_param``'s fp32 accumulator (or into
        ``into``, another accumulator of its shape: a ``HostView``'s). Thread-safe; ``accumulate_all``."""
        self.accumulate_all([(host_param, device_grad, into)])

    def accumulate_all(self, grads, *, wait: bool = True) -> None:
        """``accumulate`` for each ``(host_param, device_grad, into)``, waiting once per batch of copies: a
        device gradient is copied to host into a pooled staging buffer (pinned when the store pins, then
        asynchronously, on the calling thread's current stream), a batch of up to ``STAGE_BYTES`` queued
        before one wait, then each added under its parameter's lock. Thread-safe.

        ``wait=False``: each batch's wait and adds run on the store's adds thread (``adds``), and this
        returns once the copies are queued: the caller must not change a device gradient it handed in
        (a CPU one is added as it is, later) and reads the sums after ``flush_adds``."""
        grads = list(grads)
        for host_param, device_grad, into in grads:
            self._check_grad(host_param, device_grad, into)
        batch: list = []
        batch_bytes = 0
        for entry in grads:
            nbytes = entry[1].numel() * entry[1].element_size()
            if batch and batch_bytes + nbytes > STAGE_BYTES:
                self._add_staged(batch, wait)
                batch, batch_bytes = [], 0
            batch.append(entry)
            batch_bytes += nbytes
        if batch:
            self._add_staged(batch, wait)

    def _check_grad(self, host_param: HostParam, device_grad: torch.Tensor, into: torch.Tensor | None) -> None:
        if not host_param.trainable:
            raise ValueError(
                f"parameter {host_param.name} is frozen (requires_grad=False): it has no gradient to add to"
            )
        target = host_param.grad if into is None else into
        if device_grad.shape != target.shape:
            raise ValueError(
                f"gradient for {host_param.name} has shape {list(device_grad.shape)}, "
                f"expected {list(target.shape)}"
            )

    def _add_staged(self, batch, wait: bool) -> None:
        """Stage a batch's device gradients on the host, then wait once for the copies and add each: here, or
        (``wait=False``) on the adds thread, which gives the staging buffers back."""
        staged: list = []  # (host_param, what to add, into, pooled staging buffer or None)
        devices: set = set()
        try:
            for host_param, device_grad, into in batch:
                if device_grad.device.type == "cpu":
                    staged.append((host_param, device_grad, into, None))
                    continue
                staging = self.pool.acquire(device_grad.shape, device_grad.dtype)
                staged.append((host_param, staging, into, staging))
                devices.add(device_grad.device)
                staging.copy_(device_grad, non_blocking=staging.is_pinned())
            copied = [record_blocking(current_stream(device)) for device in devices]
            if not wait:
                nbytes = sum(grad.numel() * grad.element_size() for _, grad, _, _ in staged)
                self.adds.submit(lambda: self._add_landed(staged, copied), nbytes)
                return
        except BaseException:  # no copy may still write a buffer that goes back
            self._give_back(staged, [record_blocking(current_stream(device)) for device in devices])
            raise
        self._add_landed(staged, copied)

    def _add_landed(self, staged, copied) -> None:
        """Wait for the staging copies (``copied``: their events), add each into its accumulator, give the
        staging buffers back (after a failure too, once the copies are done)."""
        landed = False
        try:
            for event in copied:
                event.synchronize()
            landed = True
            for host_param, grad, into, _ in staged:
                with host_param.lock:
                    (host_param.grad if into is None else into).add_(grad)
        finally:
            self._give_back(staged, () if landed else copied)

    def _give_back(self, staged, copied) -> None:
        try:
            for event in copied:
                event.synchronize()
        finally:  # a copy that raised leaves a faulted device, where no copy writes any more
            for *_, staging in staged:
                if staging is not None:
                    self.pool.release(staging)

    def swap_grads(self) -> list[torch.Tensor]:
        """Exchange each accumulator with its spare (``double_buffer`` first); the spent ones, in
        ``trainable`` order. Devices add into the other set from now on (call it with no step running)."""
        self.check_double_buffered()
        self.flush_adds()
        spent = []
        for hp in self.trainable:
            with hp.lock:
                hp.grad, hp.spare_grad = hp.spare_grad, hp.grad
            spent.append(hp.spare_grad)
        return spent

    def masters_with_grads(self) -> list[torch.Tensor]:
        """The fp32 masters with ``.grad`` set to the accumulators, for a torch optimizer or clip_grad_norm_."""
        self.flush_adds()
        for hp in self.trainable:
            hp.master.grad = hp.grad
        return [hp.master for hp in self.trainable]

    def sync_working(self) -> None:
        """Copy masters into working weights where those are separate tensors (after an optimizer step)."""
        with torch.no_grad():
            for hp in self.trainable:
                if hp.master.data_ptr() != hp.param.data_ptr():  # an fp32 master is the working tensor
                    hp.param.data.copy_(hp.master)

    def write_spare_working(self) -> None:
        """Copy masters into the back working buffers (an optimizer thread, while devices read the front)."""
        self.check_double_buffered()
        with torch.no_grad():
            for hp in self.trainable:
                hp.spare_working.copy_(hp.master)

    def swap_working(self) -> None:
        """Make the back working buffers the callers' parameter data, the front ones the back (no step
        running: the devices read ``param.data`` when they upload)."""
        self.check_double_buffered()
        for hp in self.trainable:
            hp.param.data, hp.spare_working = hp.spare_working, hp.param.data

    # ---- double buffering (the one-step-stale optimizer) ----

    @property
    def double_buffered(self) -> bool:
        return any(hp.spare_grad is not None for hp in self.trainable)

    def double_buffer(self) -> int:
        """Give every trainable parameter a spare accumulator, a back working buffer (pinned when the store
        pins) and a master of its own (fp32 working weights stop being their master); idempotent.

        Host bytes added: per trainable parameter 4 (the spare accumulator) + the working dtype's size
        (the back buffer) + 4 more where the working dtype is fp32 (the separate master): 6 bytes for
        bf16 working weights, 12 for fp32. Returns the bytes added.
        """
        added = 0
        for hp in self.trainable:
            if hp.spare_grad is not None:
                continue
            data = hp.param.data
            if hp.master.data_ptr() == data.data_ptr():
                hp.master = data.detach().clone()
                added += hp.master.numel() * 4
            spare = self.pool.acquire(data.shape, data.dtype) if self.pin_memory else torch.empty_like(data)
            spare.copy_(data)
            hp.spare_working = spare
            hp.spare_grad = torch.zeros(data.shape, dtype=torch.float32)
            added += hp.nbytes + hp.spare_grad.numel() * 4
        return added

    def check_double_buffered(self) -> None:
        if not self.double_buffered:
            raise ValueError("this store has one accumulator and one working buffer: call double_buffer() first")

    def grads_to_params(self) -> None:
        """Add the accumulators into the callers' ``param.grad`` (made in the param's dtype when None).

        The mode where the caller's own optimizer steps: afterwards ``.grad`` is what a plain
        ``loss.backward()`` over the whole model would have left.
        """
        self.flush_adds()
        for hp in self.trainable:
            p = hp.param
            with hp.lock:
                if p.grad is None:
                    p.grad = hp.grad.to(dtype=p.dtype, copy=True)
                else:
                    p.grad.add_(hp.grad.to(device=p.grad.device))

    # ---- checkpoints ----

    def master_state_dict(self) -> dict[str, torch.Tensor]:
        """The fp32 masters by name (the host state a checkpoint must keep for an exact resume)."""
        self.drain()
        return {hp.name: hp.master for hp in self.trainable}

    def load_master_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``master_state_dict()`` values back into the masters and the working weights."""
        missing = [hp.name for hp in self.trainable if hp.name not in state]
        if missing:
            raise ValueError(f"master state lacks {len(missing)} trainable parameters, e.g. {missing[:3]}")
        self.drain()
        with torch.no_grad():
            for hp in self.trainable:
                hp.master.copy_(state[hp.name])
        self.sync_working()

    def __repr__(self) -> str:
        return (
            f"HostStore({self.num_layers} layers, {len(self.params)} params, {len(self.trainable)} trainable, "
            f"pin_memory={self.pin_memory})"
        )


def _nothing() -> None:
    return None
