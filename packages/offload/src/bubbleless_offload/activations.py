"""Activation transfers between a device and host buffers: ``to_host`` and ``to_device``.

RoundPipe hands activations from one device to the next through (pinned) host memory, with no
peer-to-peer link, micro-batch by micro-batch. Both functions make a real copy, on CPU too, so code
that later frees or overwrites the source cannot change what was handed on. On a GPU the copy is
queued on ``stream`` and the returned event says when it is done: wait for it (``event.wait(stream)``
on a device stream, ``event.synchronize()`` on the host) before reading the result or releasing a
pooled buffer. Tuples of tensors are the caller's to loop over.
"""

from __future__ import annotations

import torch

from .pinned_pool import PinnedPool
from .streams import CpuEvent, current_stream, mark_used_on, record_blocking, stream_context

__all__ = ["to_device", "to_host"]


def to_host(tensor: torch.Tensor, *, stream=None, pool: PinnedPool | None = None):
    """``(host copy, event)``: ``tensor`` copied into a host buffer (from ``pool`` when given, else new).

    On a GPU, ``stream`` (e.g. ``streams.out``) first waits for the calling thread's current stream,
    where ``tensor`` was made; the copy is asynchronous when the buffer is pinned.
    """
    source = tensor.detach()
    if pool is not None:
        buffer = pool.acquire(source.shape, source.dtype)
    else:
        buffer = torch.empty(source.shape, dtype=source.dtype)
    if source.device.type == "cpu":
        buffer.copy_(source)
        return buffer, CpuEvent()
    producer = current_stream(source.device)
    copier = stream if stream is not None else producer
    if stream is not None:
        stream.wait_stream(producer)
        mark_used_on(source, stream)
    with stream_context(copier):
        buffer.copy_(source, non_blocking=buffer.is_pinned())
        return buffer, record_blocking(copier)


def to_device(host_tensor: torch.Tensor, device: torch.device | str, *, stream=None, used_on=None):
    """``(device copy, event)``: ``host_tensor`` copied to ``device`` (asynchronous when pinned).

    ``stream``: where the copy is queued (e.g. ``streams.activations_in``; None: the current stream).
    ``used_on``: the stream that will read the copy (e.g. ``streams.compute``), so the allocator does
    not reuse its memory while that stream may still read it.
    """
    device = torch.device(device)
    source = host_tensor.detach()
    if device.type == "cpu":
        return source.to(device, copy=True), CpuEvent()
    copier = stream if stream is not None else current_stream(device)
    with stream_context(copier):
        result = source.to(device, non_blocking=source.is_pinned(), copy=True)
        event = record_blocking(copier)
    if used_on is not None:
        mark_used_on(result, used_on)
    return result, event
