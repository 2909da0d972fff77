"""A trained model as a Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads.

In a pipelined run every rank builds the whole model but trains only its own stages, so saving gathers
each rank's trained parameters to rank 0 of the pipeline group, which copies them into its model and
writes it with ``save_pretrained`` (safetensors, config), plus the tokenizer of the directory the model
came from. A LoRA model is saved with its adapters merged into the base weights (``merge_and_unload``),
an ordinary model with no peft needed to load it; the adapter itself is ``lora.save_lora_adapter``'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn


def gather_to_root(model: nn.Module, owned: Iterable[nn.Parameter] | None, group=None, *, trainable_only: bool = True):
    """Copy every rank's ``owned`` parameters (those that require grad, when ``trainable_only``) into the
    same-named parameters of ``model`` on rank 0 of ``group``; True on that rank (and without
    torch.distributed), False elsewhere. Must be called on every rank."""
    import torch.distributed as dist

    from .collectives import is_distributed

    if not is_distributed(group):
        return True
    owned_ids = {id(p) for p in owned} if owned is not None else None
    mine = {
        name: p.detach().cpu().clone()
        for name, p in model.named_parameters()
        if (p.requires_grad or not trainable_only) and (owned_ids is None or id(p) in owned_ids)
    }
    root = dist.get_global_rank(group, 0) if group is not None else 0
    gathered = [None] * dist.get_world_size(group) if dist.get_rank() == root else None
    dist.gather_object(mine, gathered, dst=root, group=group)
    if dist.get_rank() != root:
        return False
    params = dict(model.named_parameters())
    with torch.no_grad():
        for part in gathered:
            for name, value in part.items():
                params[name].copy_(value)
    return True


def save_pretrained_model(model: nn.Module, path: str | os.PathLike, *, owned=None, group=None,
                          tokenizer_from: str | None = None) -> str | None:
    """Write ``model`` (gathered from every rank; LoRA merged) to ``path``; the path on the writing rank,
    None elsewhere. ``tokenizer_from``: a directory whose tokenizer is saved beside the weights."""
    if not gather_to_root(model, owned, group):
        return None
    merge = getattr(model, "merge_and_unload", None)
    if callable(merge):  # a peft model: fold the adapters into the base weights, save the plain model
        model = merge()
    model.save_pretrained(str(path))
    if tokenizer_from is not None and os.path.isdir(tokenizer_from):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
        except (OSError, ValueError):
            tokenizer = None  # a model directory without a tokenizer: the weights alone
        if tokenizer is not None:
            tokenizer.save_pretrained(str(path))
    return str(path)


def save_trained_model(config, model: nn.Module, pipeline) -> str | None:
    """``bubbleless train``'s end-of-run save to ``output_dir/model`` (``train.save_model``); call on every rank."""
    if not config.train.save_model:
        return None
    path = os.path.join(config.train.output_dir, "model")
    return save_pretrained_model(model, path, owned=list(pipeline.parameters()), group=pipeline.group,
                                 tokenizer_from=config.model.path)
