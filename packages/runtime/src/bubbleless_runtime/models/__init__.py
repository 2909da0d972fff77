"""Hugging Face causal LMs (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral) as pipeline layers, with their loss."""

from .hf import (
    ARCHITECTURES,
    PipelineModel,
    build_causal_lm,
    build_hf_config,
    checkpoint_key_of,
    load_causal_lm,
    model_from_config,
    pipeline_model,
    torch_dtype,
)
from .layers import DecoderLayer, EmbeddingLayer, HeadLayer, count_moe_layers, cut_causal_lm
from .loss import IGNORE_INDEX, CausalLMLoss, chunked_cross_entropy

__all__ = [
    "ARCHITECTURES",
    "IGNORE_INDEX",
    "CausalLMLoss",
    "DecoderLayer",
    "EmbeddingLayer",
    "HeadLayer",
    "PipelineModel",
    "build_causal_lm",
    "build_hf_config",
    "checkpoint_key_of",
    "chunked_cross_entropy",
    "count_moe_layers",
    "cut_causal_lm",
    "load_causal_lm",
    "model_from_config",
    "pipeline_model",
    "torch_dtype",
]
