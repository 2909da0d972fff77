"""RoundPipe-like per-layer cost profiles, written from the models' shapes (modelled, not measured).

RoundPipe's own simulator uses per-layer forward/backward times measured on one RTX 4090 and 16
micro-batches (``reference/roundpipe.md``); we have no such measurements, so each profile is derived
from the shape's arithmetic at sequence 2048:

- **F per decoder layer** = 1 (the unit): every decoder layer of a model has the same shape.
- **LM head F** = the head's matmul FLOPs (hidden x vocab) over a decoder layer's (its active weights,
  plus attention scores and values at sequence 2048), clamped to the 1-3 layers' worth the issue gives
  (the loss runs in 4,096-token chunks and the embedding is a lookup, so a large vocabulary does not
  cost its full FLOPs share in measured runs).
- **B per layer** = ``backward`` x F, split into I and W evenly for full fine-tuning; LoRA (235B) keeps
  a tenth of W (only the adapters get weight gradients). The ratio per model is within 2.1-3.8: 2.1
  for large dense layers (matmul-bound), more for small layers (1.7B) and MoE (routing, permutes),
  whose backward is less efficient.
- **Head B** = 2 x head F (I and W); for LoRA the head is frozen, B = head F (input gradient only).
- **comm** = 0.1 F: one activation (2048 x hidden in bf16) through pinned host memory against one
  layer's forward; the same fraction for every model, since both scale with hidden.
- Recompute = forward (the default).
- **Uploads** (``with_uploads``, for the load-stream figures only; RoundPipe's simulator models none):
  a layer's LOAD moves all its bf16 weights over PCIe 4.0 (25 GB/s) while its F computes on the active
  ones at 100 TFLOP/s per token-row of 2048: load / F = 100e12 / (25e9 x 2048) = 1.95 x (all weights /
  active weights): 1.95 for dense layers, far more for MoE, whose idle experts travel too. STORE moves
  the same bytes of gradients for full fine-tuning, almost none for LoRA (adapters only).
"""

from __future__ import annotations

from dataclasses import dataclass

from bubbleless_partition.shapes import shape
from bubbleless_schedules import Costs

SEQUENCE = 2048


@dataclass(frozen=True)
class ModelShape:
    """What a profile needs of a model: per-layer active weights, vocabulary, layer count."""

    name: str
    num_layers: int
    hidden: int
    attention_weights: int
    """Per layer: q, k, v, o projection weights."""
    mlp_weights: int
    """Per layer: the MLP weights a token passes through (active experts only, plus the router)."""
    all_mlp_weights: int
    """Per layer: every MLP weight (all experts), what a LOAD uploads."""
    heads: int
    head_dim: int
    vocab: int


def from_partition(key: str) -> ModelShape:
    s = shape(key)
    attention = s.hidden * s.head_dim * (2 * s.heads + 2 * s.kv_heads)
    if getattr(s, "experts", None):
        mlp = s.top_k * 3 * s.hidden * s.expert_intermediate + s.hidden * s.experts
        every = s.experts * 3 * s.hidden * s.expert_intermediate + s.hidden * s.experts
    else:
        mlp = every = 3 * s.hidden * s.intermediate
    return ModelShape(s.name, s.num_layers, s.hidden, attention, mlp, every, s.heads, s.head_dim, s.vocab)


GPT_OSS_20B = ModelShape(
    # huggingface.co/openai/gpt-oss-20b config.json: hidden_size 2880, num_hidden_layers 24,
    # num_attention_heads 64, num_key_value_heads 8, head_dim 64, num_local_experts 32,
    # num_experts_per_tok 4, intermediate_size 2880, vocab_size 201088 (not in bubbleless_partition.shapes)
    "GPT-OSS-20B", 24, 2880, 2880 * 64 * (2 * 64 + 2 * 8), 4 * 3 * 2880 * 2880 + 2880 * 32,
    32 * 3 * 2880 * 2880 + 2880 * 32, 64, 64, 201_088,
)


def head_ratio(model: ModelShape) -> tuple[float, float]:
    """(the head's F in decoder layers from the FLOPs, the clamped value the profile uses)."""
    layer = 2 * (model.attention_weights + model.mlp_weights) + 4 * SEQUENCE * model.heads * model.head_dim
    raw = 2 * model.hidden * model.vocab / layer
    return raw, min(3.0, max(1.0, raw))


def layer_costs(model: ModelShape, backward: float, *, lora: bool = False) -> Costs:
    head = head_ratio(model)[1]
    if lora:
        backward_input, backward_weight = backward * 10 / 11, backward / 11
        head_input, head_weight = head, 0.0
    else:
        backward_input = backward_weight = backward / 2
        head_input = head_weight = head
    layers = model.num_layers
    return Costs(
        [1.0] * layers + [head], [backward_input] * layers + [head_input], [backward_weight] * layers + [head_weight],
        0.1, extra={"model": model.name, "backward_ratio": backward, "head_layers": head, "lora": lora,
                    "upload_per_f": UPLOAD_PER_F * (model.attention_weights + model.all_mlp_weights)
                    / (model.attention_weights + model.mlp_weights)},
    )


UPLOAD_PER_F = 100e12 / (25e9 * SEQUENCE)
"""A dense layer's weight upload over its forward time (see the module docstring)."""


def with_uploads(costs: Costs) -> Costs:
    """The profile with LOAD (and, for full fine-tuning, STORE) per layer; the head uploads as dense."""
    layers = len(costs.forward) - 1
    per_f, lora = costs.extra["upload_per_f"], costs.extra["lora"]
    load = [per_f * f for f in costs.forward[:-1]] + [UPLOAD_PER_F * costs.forward[-1]]
    store = [0.0] * (layers + 1) if lora else list(load)
    return Costs(costs.forward, costs.backward_input, costs.backward_weight, costs.comm, load=load, store=store,
                 extra=costs.extra)


def profiles() -> dict[str, Costs]:
    """The five models of RoundPipe's evaluation, as per-layer costs (LM head last)."""
    return {
        "qwen3-1.7b": layer_costs(from_partition("qwen3-1.7b"), 2.6),
        "llama-3.1-8b": layer_costs(from_partition("llama-3.1-8b"), 2.3),
        "gpt-oss-20b (MoE)": layer_costs(GPT_OSS_20B, 3.8),
        "qwen3-32b": layer_costs(from_partition("qwen3-32b"), 2.1),
        "qwen3-235b-a22b (LoRA)": layer_costs(from_partition("qwen3-235b-a22b"), 2.1, lora=True),
    }
