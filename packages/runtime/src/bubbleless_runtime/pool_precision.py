"""The pool's profile made to hold whatever precision a step runs in: each layer's bytes at their most.

The automatic plan and the fit check (``pool_plan_cap``, ``pool_memory``) are made when
``RoundRobinPipeline`` is built, from a profile of the layers taken then. The caller's autocast reaches the
workers only at ``step``, and a caller usually builds the pipeline outside it. Under autocast, with the
cast cache off as the workers run it (``pool_worker.run_worker``), every forward with a graph casts each
float32 weight anew, and the op saves that copy for its backward. So each held micro-batch keeps its own
low-precision copy of its group's matrices. The run-time budget counts it (a new storage, not a
parameter); a float32 profile does not. The activations themselves mostly shrink to two bytes, but not
everywhere: a float32 tensor that one op saves and the next linear saves again as its cast copy is
kept twice.

So ``bounded_over_precisions`` measures each layer's saved bytes (and its whole output's, the tensors
riding beside the main one included: the pool uploads them all) once more in each of
``PRECISIONS`` (none: float32, and autocast at each two-byte dtype, cast cache off). Each run is a
chain, every layer fed the output of the one before it in that precision. The profile then keeps, per
layer, the most of those counts and the measured ones. Layer by layer this is an upper bound of what the
executor reserves in any of them, and so it is for a group too: a storage two layers save counts in each
(``bubbleless_partition.measure``). Timings are left as measured.

The cost is that a float32 step is planned with room for the autocast copies: under ``memory_budget`` a
plan that would fit float32 alone can be refused, or cut finer. ``RoundRobinPipeline(precision=...)``
names the one precision every step runs in ("fp32": no autocast, "bf16"/"fp16": the caller's autocast at
that dtype, ``trainer.AUTOCAST_DTYPES``' names), and the profile is then raised to that precision's counts
alone (``precisions_of``); a step in another one is refused before it runs (``check_step_precision``),
since the plan holds no room for it. A profile passed as ``partition=`` is the caller's and is used as
given; the step is still checked against a named precision.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import torch

from bubbleless_partition import Profile
from bubbleless_partition.saved_tensors import SavedStorages

from .auto_partition import main_tensor_chain, riding_bytes
from .trainer import AUTOCAST_DTYPES

PRECISIONS = (None, torch.bfloat16, torch.float16)
"""What a step may run in: None for no autocast, else the autocast dtype (both two bytes, but each has its
own kernels: measured, not assumed alike)."""


def precisions_of(precision: str | None) -> tuple:
    """The autocast dtypes a plan for ``precision`` holds room for: all of ``PRECISIONS`` for None, else the
    named one's alone (None for "fp32"). ValueError for any other value."""
    if precision is None:
        return PRECISIONS
    if not isinstance(precision, str) or precision not in AUTOCAST_DTYPES:
        raise ValueError(f"precision={precision!r} is not one of {sorted(AUTOCAST_DTYPES)} or None (the default: "
                         "plan for the most any of them holds, so a step may run in any)")
    return (AUTOCAST_DTYPES[precision],)


def check_step_precision(precision: str | None, autocast: torch.dtype | None) -> None:
    """ValueError unless a step under ``autocast`` (the caller's autocast dtype, None for none) runs in the
    precision the plan was made for (None: any)."""
    if precision is None or AUTOCAST_DTYPES[precision] == autocast:
        return
    running = "no autocast (fp32)" if autocast is None else f"autocast at {autocast}"
    wanted = "no autocast" if AUTOCAST_DTYPES[precision] is None else f"autocast at {AUTOCAST_DTYPES[precision]}"
    raise ValueError(
        f"this RoundRobinPipeline was planned for precision={precision!r} ({wanted}) but step() runs under "
        f"{running}: its memory plan holds no room for what that precision saves. Step under {wanted}, or build "
        "the pipeline with the precision the steps run in (precision=None plans for any of them)"
    )


def bounded_over_precisions(measured: Profile, layers, sample_input, device: torch.device,
                            precisions: tuple = PRECISIONS) -> Profile:
    """``measured`` with each layer's activation and output bytes per token raised to the most found in any
    of ``precisions`` (module docstring). ``layers`` are the profiled ones, moved to ``device`` as the
    profiler moves them (``module.to``)."""
    counted = saved_and_output_bytes(layers, sample_input, device, precisions)
    tokens = measured.tokens_per_microbatch
    widened = tuple(
        replace(cost, activation_bytes_per_token=max(cost.activation_bytes_per_token, saved / tokens),
                output_bytes_per_token=max(cost.output_bytes_per_token, output / tokens))
        for cost, (saved, output) in zip(measured.layers, counted, strict=True))
    return measured.with_(layers=widened)


def saved_and_output_bytes(layers, sample_input, device: torch.device,
                           precisions: tuple = PRECISIONS) -> list[tuple[int, int]]:
    """Per layer, the most bytes over ``precisions`` of what one forward saves for its backward (each storage
    once, the layer's parameters and buffers left out, its input not: ``SavedStorages``) and of its output.
    Each layer is moved to ``device`` once and run in every precision before the next one is moved."""

    def counted(layer, x, dtype):
        saved, y = _forward_counted(layer, x, device, dtype)
        return (saved, _whole_output_bytes(layer, y)), y.detach()

    per_layer = walk_precision_chains(layers, sample_input, device, precisions, counted)
    return [(max(s for s, _ in runs), max(o for _, o in runs)) for runs in per_layer]


def walk_precision_chains(layers, sample_input, device: torch.device, precisions: tuple, run) -> list[list]:
    """Per layer, ``run(layer, x, dtype) -> (figure, next x)`` in each of ``precisions``: one chain per
    precision, each layer fed the output of the one before it in that chain. Each layer is moved to
    ``device`` once (``module.to``) and run in every precision before the next one is moved; the RNG is
    forked, so profiling draws nothing from the caller's stream."""
    chains = []
    for dtype in precisions:
        first, adapters = main_tensor_chain(layers, sample_input, device)
        chains.append([dtype, adapters, first.clone(memory_format=torch.contiguous_format)])
    out = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        # a dtype the device's autocast lacks runs without autocast (torch warns): float32 again, harmless
        warnings.simplefilter("ignore", UserWarning)
        for index in range(len(layers)):
            figures = []
            for chain in chains:
                dtype, adapters, x = chain
                figure, chain[2] = run(adapters[index].to(device), x, dtype)
                figures.append(figure)
            out.append(figures)
    return out


def autocast_as_worker(device: torch.device, dtype):
    """Autocast at ``dtype`` with the cast cache off, as a pool worker runs a step (None: no autocast)."""
    if dtype is None:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=False)


def _whole_output_bytes(adapter, main: torch.Tensor) -> int:
    """Bytes of the layer's whole output in this precision, the tensors riding beside its main one included
    (``auto_partition.riding_bytes``): the pool hands all of them on, uploads each and reserves them in full
    (``pool_worker._upload``)."""
    return main.numel() * main.element_size() + riding_bytes(adapter)


def _forward_counted(layer, x: torch.Tensor, device: torch.device, dtype) -> tuple[int, torch.Tensor]:
    """(bytes ``layer``'s forward on ``x`` saves for its backward, its output), under autocast at ``dtype``
    with the cast cache off (None: none), as a pool worker runs it."""
    x = x.detach().requires_grad_(x.is_floating_point())
    with autocast_as_worker(device, dtype), SavedStorages(excluded=[*layer.parameters(), *layer.buffers()]) as saved:
        y = layer(x)  # held while counting: its graph, and what that saved, lives as long as it does
        kept = saved.live
    return kept, y


__all__ = ["PRECISIONS", "autocast_as_worker", "bounded_over_precisions", "check_step_precision", "precisions_of",
           "saved_and_output_bytes", "walk_precision_chains"]
