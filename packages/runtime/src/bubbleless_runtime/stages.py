"""Cutting a model into pipeline stages and keeping this rank's share.

The caller builds the whole model on every rank (an ``nn.Sequential`` or a list of layers). Each stage
becomes an ``nn.Sequential`` that *holds the caller's own layer objects* (no copies), so optimizers,
state dicts, LoRA adapters and parameter names the caller set up keep pointing at what trains.
An activation between layers is whatever the previous layer returned: a Tensor or a tuple of Tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def layers_of(model) -> list[nn.Module]:
    """The model as a flat list of layers; ``ValueError`` for anything else."""
    if isinstance(model, nn.Sequential):
        layers = list(model)
    elif isinstance(model, (list, tuple, nn.ModuleList)):
        layers = list(model)
    else:
        raise ValueError(
            f"model must be an nn.Sequential or a list of layers, got {type(model).__name__}; "
            "wrap your layers with nn.Sequential(...) so the pipeline can cut between them"
        )
    bad = [i for i, layer in enumerate(layers) if not isinstance(layer, nn.Module)]
    if bad:
        raise ValueError(f"model entries {bad} are not nn.Module instances; every layer must be an nn.Module")
    return layers


def stage_sizes(num_layers: int, num_stages: int, partition=None) -> list[int]:
    """Layer counts per stage: even by default (``None`` or ``"even"``), else ``partition`` (a list, or an
    object with ``.sizes``). ``"auto"`` is resolved to sizes by the ``Pipeline`` before this is called."""
    if isinstance(partition, str) and partition != "even":
        raise ValueError(
            f"partition {partition!r} is not a cut; pass 'even', 'auto', a list of layer counts per stage "
            "or a bubbleless_partition.Partition"
        )
    if partition is None or partition == "even":
        if num_layers < num_stages:
            raise ValueError(
                f"the model has {num_layers} layers but the schedule has {num_stages} stages; "
                f"give a model with at least {num_stages} layers or a schedule with fewer stages"
            )
        base, extra = divmod(num_layers, num_stages)
        return [base + (1 if s < extra else 0) for s in range(num_stages)]
    sizes = getattr(partition, "sizes", partition)
    if not isinstance(sizes, Sequence) or not all(isinstance(n, int) and not isinstance(n, bool) for n in sizes):
        raise ValueError(f"partition must be a list of layer counts per stage (or have .sizes), got {partition!r}")
    sizes = list(sizes)
    if len(sizes) != num_stages:
        raise ValueError(
            f"partition gives {len(sizes)} stages but the schedule has {num_stages}; give one layer count per stage"
        )
    if any(n < 1 for n in sizes):
        raise ValueError(f"partition {sizes} has a stage with no layers; every stage needs at least one layer")
    if sum(sizes) != num_layers:
        raise ValueError(
            f"partition {sizes} covers {sum(sizes)} layers but the model has {num_layers}; "
            f"make the counts sum to {num_layers}"
        )
    return sizes


def cut(layers: Sequence[nn.Module], sizes: Sequence[int], stages: Sequence[int]) -> dict[int, nn.Sequential]:
    """The modules of ``stages`` (stage index -> nn.Sequential of the caller's own layers)."""
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    return {s: nn.Sequential(*layers[starts[s]:starts[s] + sizes[s]]) for s in stages}
