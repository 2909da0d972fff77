"""LoRA through peft: inject adapters, train only them, save a peft adapter from a pipelined run.

Adapters are injected into the Hugging Face model before or after it is cut into pipeline layers (the
layers hold the decoder modules, and peft swaps the linear layers inside them in place). In a pipelined
run each rank trains only the adapters of its own stages, so saving gathers every rank's adapters to
rank 0, which writes one ordinary peft adapter directory that ``PeftModel.from_pretrained`` loads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch
from torch import nn

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def apply_lora(
    model: nn.Module,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    target_modules: Sequence[str] = DEFAULT_TARGETS,
) -> nn.Module:
    """Wrap ``model`` in a peft LoRA model: base weights frozen, only ``lora_*`` weights require grad."""
    from peft import LoraConfig, get_peft_model

    if rank <= 0:
        raise ValueError(f"lora rank must be positive, got {rank}")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in target_modules if t not in present]
    if missing or not target_modules:
        raise ValueError(
            f"lora target_modules {missing or list(target_modules)} match no module of the model; "
            f"choose among linear layers such as {sorted(DEFAULT_TARGETS)}"
        )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def trainable_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that will train (for LoRA: the adapters only)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def save_lora_adapter(
    peft_model: nn.Module,
    path: str | os.PathLike,
    *,
    owned: Iterable[nn.Parameter] | None = None,
    group=None,
) -> str | None:
    """Write the peft adapter of a (possibly pipelined) run; returns the path on the writing rank.

    ``owned``: the parameters this rank trained (``pipeline.parameters()``). When torch.distributed is
    initialised, every rank sends its owned adapter weights to rank 0 of ``group``, which overwrites its
    own copies with them and saves; other ranks return None. Must be called on every rank.
    """
    import torch.distributed as dist

    from .collectives import is_distributed

    if is_distributed(group):
        owned_ids = {id(p) for p in owned} if owned is not None else None
        mine = {
            name: p.detach().cpu().clone()
            for name, p in peft_model.named_parameters()
            if p.requires_grad and (owned_ids is None or id(p) in owned_ids)
        }
        root = dist.get_global_rank(group, 0) if group is not None else 0
        gathered = [None] * dist.get_world_size(group) if dist.get_rank() == root else None
        dist.gather_object(mine, gathered, dst=root, group=group)
        if dist.get_rank() != root:
            return None
        params = dict(peft_model.named_parameters())
        with torch.no_grad():
            for part in gathered:
                for name, value in part.items():
                    params[name].copy_(value)
    for config in getattr(peft_model, "peft_config", {}).values():  # a local base: findable from anywhere
        base = getattr(config, "base_model_name_or_path", None)
        if base and os.path.isdir(base) and not os.path.isabs(base):
            config.base_model_name_or_path = os.path.abspath(base)
    peft_model.save_pretrained(str(path))
    return str(path)
