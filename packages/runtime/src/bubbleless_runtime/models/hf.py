"""Build (from a config, no download) or load (from a local path) the Hugging Face models we cut.

One table (``ARCHITECTURES``) maps an architecture name (a transformers ``model_type``) to its
transformers classes and to the config fields a ``ModelConfig`` gives it, so adding an architecture
whose layers ``cut_causal_lm`` can cut is one entry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .layers import count_moe_layers, cut_causal_lm
from .loss import CausalLMLoss


def _dense_fields(m) -> dict:
    return dict(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_embeddings,
    )  # fmt: skip


def _derived_head_fields(m) -> dict:
    fields = _dense_fields(m)
    fields.pop("head_dim")  # these derive it from hidden_size / num_heads
    return fields


def _moe_fields(m) -> dict:
    return dict(
        _dense_fields(m), num_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
        moe_intermediate_size=m.moe_intermediate_size, router_aux_loss_coef=m.aux_loss_coef,
    )  # fmt: skip


@dataclass(frozen=True)
class Architecture:
    """One causal LM family we cut: its transformers classes and how a ``ModelConfig`` sizes it."""

    config_class: str
    """Name of the transformers config class."""
    model_class: str
    """Name of the transformers ``*ForCausalLM`` class."""
    fields: Callable = _dense_fields
    """``ModelConfig`` -> the config class's keyword arguments (for a model built from sizes)."""
    moe: bool = False
    """Routes through experts (the config's ``aux_loss_coef`` weighs the load-balancing loss)."""


# architecture name (transformers model_type) -> what builds and loads it
ARCHITECTURES: dict[str, Architecture] = {
    "qwen3": Architecture("Qwen3Config", "Qwen3ForCausalLM"),
    "llama": Architecture("LlamaConfig", "LlamaForCausalLM", _derived_head_fields),
    "qwen3_moe": Architecture("Qwen3MoeConfig", "Qwen3MoeForCausalLM", _moe_fields, moe=True),
    "qwen2": Architecture("Qwen2Config", "Qwen2ForCausalLM", _derived_head_fields),
    "mistral": Architecture("MistralConfig", "MistralForCausalLM"),
}

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""``model.dtype`` -> the torch dtype's name."""


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
    entry = ARCHITECTURES[architecture]
    return getattr(transformers, entry.config_class), getattr(transformers, entry.model_class)


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


def torch_dtype(name: str):
    """The torch dtype of a ``model.dtype`` name."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"model.dtype {name!r} is unknown; choose one of {list(DTYPES)}")
    return getattr(torch, DTYPES[name])


def load_causal_lm(path: str | os.PathLike, *, dtype: str = "fp32", **kwargs) -> nn.Module:
    """A causal LM from a local directory (``save_pretrained`` output: config, safetensors), its weights
    in ``dtype``; never downloads. ``ValueError`` for a missing directory or an architecture we do not cut."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not os.path.isdir(path):
        raise ValueError(f"model path {str(path)!r} is not a local directory; point model.path at one")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model path {str(path)!r} has no config.json; point model.path at a save_pretrained directory")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in ARCHITECTURES:
        raise ValueError(
            f"model.path {str(path)!r} holds a {config.model_type!r} model; the pipeline cuts {sorted(ARCHITECTURES)}"
        )
    kwargs.setdefault("attn_implementation", "sdpa")
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype(dtype), **kwargs)


def model_from_config(model_config, *, seed: int | None = None) -> tuple[nn.Module, float | None]:
    """(the causal LM a ``ModelConfig`` names, the aux-loss coefficient to use or None for the model's own):
    loaded from ``path`` when set, else built from the sizes with fresh weights (seeded)."""
    m = model_config
    if m.path is not None:
        return load_causal_lm(m.path, dtype=m.dtype), None
    entry = ARCHITECTURES.get(m.architecture)
    if entry is None:
        raise ValueError(f"model.architecture {m.architecture!r} is unknown; choose one of {sorted(ARCHITECTURES)}")
    model = build_causal_lm(m.architecture, seed=seed, **entry.fields(m))
    return model.to(torch_dtype(m.dtype)), (m.aux_loss_coef if entry.moe else None)


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
