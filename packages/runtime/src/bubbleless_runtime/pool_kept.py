"""What a split backward's W keeps from its I, per layer, profiled for the pool's memory plan.

Between a micro-batch's I and its W the queued weight gradients keep each deferred linear's input ``x``
and output gradient ``g`` (``split_backward``), and the pool reserves the storages still alive then
(``pool_split.Deferred.hold``). The ``g`` of a linear whose output no later op saves (Linear -> Linear,
a linear feeding a residual add) is in none of the profile's figures (saved bytes, boundaries): a plan
counted from those alone ran out at its first step (6 x (Linear(64, 256), Linear(256, 64)), 1,024 rows,
m=4: estimated 4,726,272 bytes a device, 7,740,928 reserved).

So the profiler runs each layer the way a split job's worker does: a forward under the noting deferral,
then I with an output gradient the size of its output, its graph and the tensors handed in and out
dropped, and counts the noted storages still alive (what ``Deferred.hold`` reserves): the layer's
"kept until W" bytes, per token, in ``Profile.extra[KEPT_UNTIL_W]`` (a ``Profile`` records no such field;
``extra`` travels with it when the caller passes it on as ``partition=``). The layer's input and output
gradient are counted where W keeps them (the group's upload and the gradient its B receives), so a
job's figure is the sum over its layers. A profile without the entry (written by hand, analytic) gives
no figure, and the plan then holds a micro-batch's R-to-I bytes until W, as before.
"""

from __future__ import annotations

import torch

from bubbleless_partition import Profile
from bubbleless_partition.saved_tensors import SavedStorages

from .pool_precision import autocast_as_worker, walk_precision_chains
from .pool_split import Deferred

KEPT_UNTIL_W = "kept_until_w_bytes_per_token"
"""``Profile.extra`` key: per layer, the bytes a split backward's W keeps from the layer's I, per token."""


def with_kept_until_w(profile: Profile, layers, sample_input, device: torch.device, precisions: tuple) -> Profile:
    """``profile`` with ``extra[KEPT_UNTIL_W]`` measured (module docstring), the most over ``precisions``."""
    kept = kept_until_w_bytes(layers, sample_input, device, precisions)
    tokens = profile.tokens_per_microbatch
    return profile.with_(extra={**profile.extra, KEPT_UNTIL_W: [k / tokens for k in kept]})


def kept_until_w_bytes(layers, sample_input, device: torch.device, precisions: tuple) -> list[int]:
    """Per layer, the most bytes over ``precisions`` (autocast dtypes, None for none) that its deferred
    weight gradients keep after I (module docstring). ``layers`` are moved to ``device`` (``module.to``)."""

    def kept(layer, x, dtype):
        return _kept_after_input_grad(layer, x, device, dtype)

    return [max(runs) for runs in walk_precision_chains(layers, sample_input, device, precisions, kept)]


def _kept_after_input_grad(layer, x: torch.Tensor, device: torch.device, dtype) -> tuple[int, torch.Tensor]:
    """(bytes alive after I of ``layer`` on a copy of ``x`` that its queued weight gradients keep, the
    layer's output detached for the next layer), as a pool worker runs a split job's layer."""
    deferred = Deferred()
    weights = [*layer.parameters(), *layer.buffers()]
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    with autocast_as_worker(device, dtype), SavedStorages(excluded=weights, on_save=lambda t, added: deferred.note(t) if added else None), \
            deferred.deferral():
        y = layer(x)
    following = y.detach().clone()
    if y.requires_grad:
        torch.autograd.backward(y, torch.ones_like(y))
    del x, y  # the graph, the layer's input and the gradient handed in: alive after this only if W keeps them
    kept = deferred.alive_bytes()
    deferred.queue.clear()
    for weight in layer.parameters():
        weight.grad = None
    return kept, following


__all__ = ["KEPT_UNTIL_W", "kept_until_w_bytes", "with_kept_until_w"]
