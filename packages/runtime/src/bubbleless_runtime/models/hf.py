"""Build (from a config, no download) or load (from a local path) the Hugging Face models we cut.

One table maps an architecture name to its transformers classes, so adding an architecture is one line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .layers import count_moe_layers, cut_causal_lm
from .loss import CausalLMLoss

# architecture name -> (config class name, causal LM class name) in transformers
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


@dataclass(frozen=True, kw_only=True)
class PipelineModel:
    """A Hugging Face causal LM and the pipeline layers cut from it (sharing its modules)."""

    model: nn.Module
    """The Hugging Face model (or the peft model wrapping it once LoRA is applied)."""
    layers: list[nn.Module]
    """[embedding, decoder layers..., norm + LM head], each taking and returning the activation."""
    loss_fn: CausalLMLoss
    """The matching loss for the pipeline's last stage."""


def _classes(architecture: str):
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}; choose one of {sorted(ARCHITECTURES)}")
    config_name, model_name = ARCHITECTURES[architecture]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def build_hf_config(architecture: str, **fields):
    """A transformers config for ``architecture`` with ``fields`` overriding its defaults."""
    config_class, _ = _classes(architecture)
    fields.setdefault("attn_implementation", "sdpa")
    return config_class(**fields)


def build_causal_lm(architecture: str, *, seed: int | None = None, **fields) -> nn.Module:
    """A freshly initialised causal LM; ``seed`` makes every rank build identical weights."""
    import torch

    _, model_class = _classes(architecture)
    config = build_hf_config(architecture, **fields)
    if seed is not None:
        torch.manual_seed(seed)
    return model_class(config)


def load_causal_lm(path: str | os.PathLike, **kwargs) -> nn.Module:
    """A causal LM from a local directory (``save_pretrained`` output); never downloads."""
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(path):
        raise ValueError(f"model path {str(path)!r} is not a local directory; point model.path at one")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)


def checkpoint_key_of(model: nn.Module, layers) -> Callable[[str], str]:
    """Map the device pool's store names (``"<layer index>.<name in the layer>"``, as
    ``bubbleless_offload.HostStore`` names parameters) to the keys ``save_pretrained`` wrote for the same
    tensors (``model.layers.0.self_attn.q_proj.weight``), peft's wrapping undone: what
    ``RoundRobinPipeline(frozen_safetensors=..., safetensors_key=...)`` needs to memory-map a LoRA run's
    frozen base weights from the model's own ``model.safetensors``."""
    full_name = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        full_name.setdefault(id(p), _checkpoint_name(name))
    keys = {}
    for index, layer in enumerate(layers):
        for name, p in layer.named_parameters(remove_duplicate=False):
            if id(p) in full_name:
                keys[f"{index}.{name}"] = full_name[id(p)]

    def key_of(store_name: str) -> str:
        return keys.get(store_name, store_name)

    return key_of


def _checkpoint_name(name: str) -> str:
    """A parameter name as the base model's checkpoint spells it (peft's prefix and base_layer removed)."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace(".base_layer.", ".")


def pipeline_model(model: nn.Module, *, aux_loss_coef: float | None = None, chunk_tokens: int = 4096):
    """Cut ``model`` into layers and pair them with the causal LM loss (MoE aux loss included)."""
    layers = cut_causal_lm(model)
    config = layers[1].config if len(layers) > 2 else None
    num_experts = getattr(config, "num_experts", 0) or 0
    moe_layers = count_moe_layers(layers)
    if aux_loss_coef is None:
        aux_loss_coef = getattr(config, "router_aux_loss_coef", 0.0) if moe_layers else 0.0
    loss_fn = CausalLMLoss(
        num_experts=num_experts if moe_layers else 0,
        num_moe_layers=moe_layers,
        aux_loss_coef=aux_loss_coef,
        chunk_tokens=chunk_tokens,
    )
    return PipelineModel(model=model, layers=layers, loss_fn=loss_fn)
