"""Measure a profile on the real device: ``profile(layers, sample_input)``.

torch is imported when this runs, not when the package is imported (torch is the ``profile`` extra).
Each layer is timed on the output of the one before it, so shapes are the model's own:

- F: the forward that builds the autograd graph;
- I: ``torch.autograd.grad`` of the output with respect to the layer's input only;
- W: ``torch.autograd.grad`` with respect to the layer's parameters only (a separate pass over the
  graph: the two passes together cost more than one fused backward, as split-backward runtimes pay too);
- R: the same forward timed again as a backward stage re-runs it from its saved input.

Every figure is the median of ``repeats`` timings after ``warmup`` untimed runs, with the device
synchronised around each; the I and W passes all run over the graph of the first forward, kept between
them (``retain_graph``), so each pass is the backward alone and no forward is re-run for it. Output bytes
are what the layer returns, divided by the token count.

Activation bytes per token are what one micro-batch keeps alive on the layer's stage from its forward
until its backward, the bytes ``Profile.layer_memory`` multiplies by the tokens and the micro-batches in
flight (what ``cut(memory_cap=...)``, ``partition="auto"`` and the pool's fit check plan with): the
storages autograd saves for backward (``saved_tensors.SavedStorages``), each once however many ops saved
it (an input read by two linears), counted while the layer's output still holds its graph. The layer's
parameters and buffers are left out, saved or not (a linear keeps its weight for the input gradient):
they are ``param_bytes``, held once whatever the micro-batches. Scratch an op frees before the layer
returns is left out too; it is the forward's working memory, not what waits for the backward. A
layer's saved input counts here (a ``Linear``'s activation bytes are its input's bytes). Each layer is
counted on its own, so a tensor two layers both save (a tanh's output, the next linear's input) counts
in each: what two stages hold when cut between them, a little more than one stage holding both does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import median

from .layers import LayerCost, Profile


def _synchronizer(torch, device):
    backend = getattr(torch, device.type, None)
    sync = getattr(backend, "synchronize", None)
    return (lambda: sync(device)) if sync is not None and device.type != "cpu" else (lambda: None)


def _timed(run, sync, repeats: int, warmup: int) -> float:
    """Median milliseconds of ``run()`` over ``repeats`` timed calls."""
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return median(samples)


def _tokens(sample) -> int:
    """Token ids ``[batch, seq]`` count every entry; hidden states ``[..., width]`` all but the last dim."""
    if sample.is_floating_point() and sample.dim() > 1:
        return max(1, sample.numel() // sample.shape[-1])
    return max(1, sample.numel())


def _saved_bytes(layer, x) -> int:
    """Bytes of the storages one forward of ``layer`` keeps for its backward (see the module docstring)."""
    from .saved_tensors import SavedStorages

    with SavedStorages(excluded=[*layer.parameters(), *layer.buffers()]) as saved:
        output = layer(x)  # held while counting: its graph, and what that saved, lives as long as it does
        kept = saved.live
    del output
    return kept


def _measure_layer(torch, name: str, layer, x, sync, repeats: int, warmup: int, tokens: int):
    wants_input_grad = x.is_floating_point()
    x = x.detach().requires_grad_(wants_input_grad)
    params = [p for p in layer.parameters() if p.requires_grad]
    y = layer(x)
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"layer {name} returned {type(y).__name__}; profile() needs layers that return one tensor")
    grad_out = torch.ones_like(y)

    forward = _timed(lambda: layer(x), sync, repeats, warmup)
    recompute = _timed(lambda: layer(x.detach().requires_grad_(wants_input_grad)), sync, repeats, warmup)

    def backward_pass(targets):
        sync()
        start = time.perf_counter()
        torch.autograd.grad(y, targets, grad_out, allow_unused=True, retain_graph=True)
        sync()
        return (time.perf_counter() - start) * 1e3

    def median_of(targets) -> float:
        if not targets or not y.requires_grad:
            return 0.0
        for _ in range(warmup):  # every pass over y's graph, retained: a forward per pass was most of the profiling
            backward_pass(targets)
        return median(backward_pass(targets) for _ in range(repeats))

    cost = LayerCost(
        name=name,
        forward=forward,
        input_grad=median_of([x] if wants_input_grad else []),
        weight_grad=median_of(params),
        recompute=recompute,
        param_bytes=sum(p.numel() * p.element_size() for p in layer.parameters()),
        activation_bytes_per_token=_saved_bytes(layer, x) / tokens,
        output_bytes_per_token=y.numel() * y.element_size() / tokens,
    )
    return cost, y.detach()


def profile(layers: Sequence, sample_input, *, repeats: int = 5, warmup: int = 1, device=None,
            names: Sequence[str] | None = None, name: str = "measured") -> Profile:
    """Time each layer of ``layers`` (modules run in order, e.g. an ``nn.Sequential``) on ``sample_input``.

    ``sample_input`` is one micro-batch for the first layer. ``device``: where to run; the layers are moved
    there (``module.to``) and so is the input; None uses the input's device. ``names`` label the layers
    (default: their index). Layers must take and return one tensor.
    """
    import torch

    layers = list(layers)
    if not layers:
        raise ValueError("profile() needs at least one layer")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats!r}, warmup={warmup!r}")
    if names is not None and len(names) != len(layers):
        raise ValueError(f"names has {len(names)} entries for {len(layers)} layers")
    if not isinstance(sample_input, torch.Tensor):
        raise ValueError(f"sample_input must be a tensor, got {type(sample_input).__name__}")
    device = torch.device(device) if device is not None else sample_input.device
    sync = _synchronizer(torch, device)
    tokens = _tokens(sample_input)
    # its own storage: a micro-batch sliced from a batch is a view of the whole, and the first layer
    # saving it (an embedding's ids) would count the whole batch's bytes
    x = sample_input.to(device).clone(memory_format=torch.contiguous_format)
    costs = []
    for index, layer in enumerate(layers):
        layer.to(device)
        label = names[index] if names is not None else str(index)
        cost, x = _measure_layer(torch, label, layer, x, sync, repeats, warmup, tokens)
        costs.append(cost)
    return Profile(layers=tuple(costs), tokens_per_microbatch=tokens, name=name, source=f"measured on {device}")
