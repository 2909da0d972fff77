"""``DeviceWeights``: one device's view of the host store, loading a job's layers and storing their grads.

A device holds no weights between jobs. For each layer it keeps a *shell*: a structural copy of the
caller's layer (``copy.deepcopy`` with every parameter and buffer mapped to an empty placeholder, so
no weight-sized copy is made) whose tensors are filled with fresh device copies when a job loads the
layer and emptied when it is released. Shells are built once per (device, layer) and reused, so
modules are not rebuilt on every job, and autograd accumulates a job's micro-batch gradients into
the shell parameters' ``.grad`` as usual.

A shell belongs to one live job at a time. Two live jobs on one device may share layers (a forward
group and a backward group cut differently, the next job prefetched while the current one runs): the
second gets a second shell of the shared layers and its own copies of their weights, so the jobs never
see each other's tensors or gradients. At most as many shells per layer as jobs were ever live at once.

A parameter shared by two layers of the same job (tied weights) is uploaded once, and for the job's
lifetime both shells hold the same ``nn.Parameter`` (the first layer's placeholder): autograd then sums
its gradient exactly as in the caller's model, and the device holds one gradient for it, not two.

The copies themselves go through the device's ``WeightUploads``: on an accelerator, cut into chunks
and paced behind the device's activation uploads (``weight_uploads``); a job's device tensors are
allocated when it loads, and filled by the time ``LoadedJob.ready`` says so.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .host_store import HostParam, HostStore
from .host_view import HostView
from .memory_budget import MemoryBudget
from .streams import DeviceStreams, mark_used_on, stream_context
from .weight_uploads import Upload, WeightUploads

__all__ = ["DeviceWeights", "LoadedJob"]


@dataclass(eq=False)
class _Shell:
    """A per-device structural copy of one layer, and where its tensors come from."""

    module: nn.Module
    params: list[tuple[nn.Parameter, HostParam]]  # one entry per unique parameter of the layer
    slots: dict[int, list[tuple[nn.Module, str]]]  # id(placeholder) -> where the shell holds it
    buffers: list[tuple[nn.Module, str, torch.Tensor]]  # (owner in the shell, key, host buffer)
    pairs: list[tuple[nn.Module, nn.Module]]  # (caller's module, shell module), for the training flag


@dataclass(eq=False, kw_only=True)
class LoadedJob:
    """A job's layers resident on a device; valid until ``DeviceWeights.release``."""

    layers: tuple[int, ...]
    """Layer indices, in the order given to ``load``."""
    modules: list[nn.Module]
    """One shell module per layer index, in order; run them like the caller's layers."""
    ready: Upload | None
    """Its weight upload: ``ready.wait(streams.compute)`` before computing (an event's interface)."""
    nbytes: int
    """Bytes uploaded (and reserved in the budget): each unique param and buffer once."""
    view: HostView | None = None
    """Where its weights came from and its gradients go (None: the callers' parameters, the front
    accumulators)."""
    _shells: list[_Shell] = field(repr=False)
    _params: dict[int, tuple[HostParam, nn.Parameter]] = field(default_factory=dict, repr=False)
    """id(HostParam) -> (it, the one device parameter the job's shells share for it)."""
    _rebound: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list, repr=False)
    """Slots pointed at another shell's parameter for this job: (owner, key, the shell's own placeholder)."""
    _released: bool = field(default=False, repr=False)


class DeviceWeights:
    """Weight residency of one device for round-robin jobs over ``store``.

    ``streams``: the device's streams (None: new ``DeviceStreams(device)``). ``budget``: the device's
    ``MemoryBudget``, shared with the executor's activation accounting (None: one without a limit).
    ``uploads``: how weight copies are issued (None: ``WeightUploads(streams)``, paced on an
    accelerator). Thread-safe bookkeeping; downloads run on the calling thread.
    """

    def __init__(
        self,
        store: HostStore,
        device: torch.device | str,
        *,
        streams: DeviceStreams | None = None,
        budget: MemoryBudget | None = None,
        uploads: WeightUploads | None = None,
    ) -> None:
        self.store = store
        self.streams = streams if streams is not None else DeviceStreams(device)
        self.device = self.streams.device
        if torch.device(device).type != self.device.type:
            raise ValueError(f"streams are for {self.device}, not {device}; build DeviceStreams({str(device)!r})")
        self.budget = budget if budget is not None else MemoryBudget(None, self.device)
        self.uploads = uploads if uploads is not None else WeightUploads(self.streams)
        if self.uploads.streams is not self.streams:
            raise ValueError("uploads were built for other streams: pass WeightUploads(streams) with this device's streams")
        self.store_waits = self.device.type == "cpu"
        """Whether ``store_grads`` adds before returning by default: on a CPU device (its adds would only
        compete with its own compute for the cores); an accelerator's leave them to the store's thread."""
        self._lock = threading.Lock()
        self._shells: dict[int, list[_Shell]] = {}  # layer index -> its shells on this device
        self._in_use: set[int] = set()  # id() of the shells live jobs hold
        self._live: list[LoadedJob] = []

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights on the device now (all live jobs)."""
        with self._lock:
            return sum(job.nbytes for job in self._live)

    def load(self, layer_indices: Sequence[int], view: HostView | None = None) -> LoadedJob:
        """Upload the params and buffers of these layers on the ``weights_in`` stream; see ``LoadedJob``.
        ``view``: the host tensors of one iteration of several running at once (``HostView``)."""
        layers = tuple(layer_indices)
        if not layers or len(set(layers)) != len(layers):
            raise ValueError(f"load() needs distinct layer indices, got {layers}")
        nbytes = self.store.weight_bytes(layers)  # also checks the indices
        with self._lock:
            self.budget.reserve(nbytes, f"weights of layers {layers}")
            job = LoadedJob(layers=layers, modules=[], ready=None, nbytes=nbytes, view=view, _shells=[])
            self._live.append(job)
            job._shells = [self._free_shell(i) for i in layers]  # held from here on: no other job takes them
        try:
            for position, shell in enumerate(job._shells):
                if shell is None:
                    job._shells[position] = self._new_shell(layers[position])
            job.modules = [shell.module for shell in job._shells]
            job.ready = self._upload(job)
        except BaseException:
            self.release(job)
            raise
        return job

    def store_grads(self, loaded: LoadedJob, *, wait: bool | None = None):
        """Add the job's device ``.grad``s into the host accumulators (its view's, if it was loaded with one)
        on the ``out`` stream, then drop them. Frozen parameters are never touched.

        Waits for the compute stream and the calling thread's current stream first. ``wait`` (None:
        ``store_waits``): add before returning; else queue the copies and leave the adds to the store's
        adds thread (``HostStore.flush_adds`` waits for them), so this thread goes on to its next work at
        once. Returns the event of the copies' end on ``out`` (already complete when it waited).
        """
        self._check_live(loaded)
        streams = self.streams
        for stream in (streams.compute, streams.current()):
            streams.record(stream).wait(streams.out)
        with stream_context(streams.out):
            grads = []
            for hp, param in loaded._params.values():
                if hp.trainable and param.grad is not None:
                    mark_used_on(param.grad, streams.out)
                    grads.append((hp, param.grad, None if loaded.view is None else loaded.view.grad_of(hp)))
            # the copies queued together, one wait per batch of them
            self.store.accumulate_all(grads, wait=self.store_waits if wait is None else wait)
            for _, param in loaded._params.values():
                param.grad = None
            return streams.record(streams.out)

    def release(self, loaded: LoadedJob) -> None:
        """Drop the job's device tensors (shells keep empty placeholders) and free its budget bytes."""
        with self._lock:  # empty the shells before marking them free, so no other load sees them half-reset
            if loaded._released:
                raise ValueError(f"job {loaded.layers} on {self.device} was released already")
            loaded._released = True
            if loaded.ready is not None:
                loaded.ready.cancel()  # chunks not issued yet never go (issued ones finish in stream order)
            for owner, key, placeholder in loaded._rebound:
                owner._parameters[key] = placeholder
            for shell in filter(None, loaded._shells):
                for placeholder, _ in shell.params:
                    placeholder.data = self._empty(placeholder.dtype)
                    placeholder.grad = None
                for owner, key, host in shell.buffers:
                    owner._buffers[key] = self._empty(host.dtype)
                self._in_use.discard(id(shell))
            self._live.remove(loaded)
            self.budget.free(loaded.nbytes)

    # ---- internals ----

    def _check_live(self, loaded: LoadedJob) -> None:
        if loaded._released or not any(job is loaded for job in self._live):
            raise ValueError(f"job {loaded.layers} is not loaded on {self.device}")

    def _empty(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(0, dtype=dtype, device=self.device)

    def _free_shell(self, index: int) -> _Shell | None:
        """A built shell of layer ``index`` no live job holds, now marked held; None if there is none (locked)."""
        for shell in self._shells.get(index, ()):
            if id(shell) not in self._in_use:
                self._in_use.add(id(shell))
                return shell
        return None

    def _new_shell(self, index: int) -> _Shell:
        """Build one more shell of layer ``index`` (outside the lock: a deepcopy), held by the caller's job."""
        shell = self._build_shell(index)
        with self._lock:
            self._shells.setdefault(index, []).append(shell)
            self._in_use.add(id(shell))
        return shell

    def _build_shell(self, index: int) -> _Shell:
        layer = self.store.layers[index]
        memo: dict[int, object] = {}
        params = []
        for _, hp in self.store.layer_params(index):
            if id(hp.param) not in memo:
                memo[id(hp.param)] = nn.Parameter(self._empty(hp.param.dtype), requires_grad=hp.trainable)
                params.append((memo[id(hp.param)], hp))
        for _, buffer in self.store.layer_buffers(index):
            memo.setdefault(id(buffer), self._empty(buffer.dtype))
        module = copy.deepcopy(layer, memo)
        slots: dict[int, list[tuple[nn.Module, str]]] = {}
        for name, placeholder in module.named_parameters(remove_duplicate=False):
            slots.setdefault(id(placeholder), []).append(_slot(module, name))
        buffers = [(*_slot(module, name), host) for name, host in self.store.layer_buffers(index)]
        pairs = list(zip(layer.modules(), module.modules(), strict=True))
        return _Shell(module=module, params=params, slots=slots, buffers=buffers, pairs=pairs)

    def _upload(self, job: LoadedJob) -> Upload:
        """Fresh device tensors for the job's params and buffers, filled by ``self.uploads``."""
        streams, device_copies, copies = self.streams, {}, []

        def copy_of(key: tuple[str, int], host: torch.Tensor) -> torch.Tensor:
            if key not in device_copies:  # a tensor shared by several layers of the job moves once
                with stream_context(streams.weights_in):  # allocated where it is written
                    if self.uploads.paced:  # filled later, chunk by chunk
                        device_copy = torch.empty_like(host, device=self.device)
                        copies.append((host, device_copy))
                    else:  # issued now, in one step
                        device_copy = host.to(self.device, non_blocking=host.is_pinned(), copy=True)
                mark_used_on(device_copy, streams.compute)
                device_copies[key] = device_copy
            return device_copies[key]

        for shell in job._shells:
            for original, shell_module in shell.pairs:
                shell_module.training = original.training
            for placeholder, hp in shell.params:
                if id(hp) in job._params:  # tied to a layer loaded before it in this job: share that one
                    shared = job._params[id(hp)][1]
                    for owner, key in shell.slots[id(placeholder)]:
                        owner._parameters[key] = shared
                        job._rebound.append((owner, key, placeholder))
                    continue
                source = hp.param.data if job.view is None else job.view.working_of(hp)
                placeholder.data = copy_of(("param", id(hp)), source)
                placeholder.requires_grad_(hp.trainable)
                placeholder.grad = None
                job._params[id(hp)] = (hp, placeholder)
            for owner, key, host in shell.buffers:
                owner._buffers[key] = copy_of(("buffer", id(host)), host)
        return self.uploads.upload(copies)


def _slot(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    """(the submodule holding ``name``, its key there): where to swap a tensor in."""
    prefix, _, key = name.rpartition(".")
    return module.get_submodule(prefix), key
