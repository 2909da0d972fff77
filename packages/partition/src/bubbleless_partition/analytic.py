"""Profiles from FLOP and byte counts of a decoder-only transformer, for hardware we cannot measure on.

Layers, in order: the token embedding, ``num_layers`` decoder layers, and the LM head (final norm,
vocabulary projection and cross-entropy loss). Matrix multiplies are priced at the hardware's effective
FLOP rate; the embedding gather/scatter and the loss's elementwise work at its memory bandwidth. Norms,
rotary embeddings and residual adds are left out: they are the same in every decoder layer and small.

Per token, a weight matmul of ``a x b`` costs ``2ab`` FLOPs forward, the same again for the input
gradient and for the weight gradient. Causal attention over ``s`` tokens costs ``2 * heads * head_dim * s``
forward per token (QK^T and AV, half the keys on average), twice that in the input gradient and nothing
in the weight gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import Hardware
from .layers import LayerCost, Profile

LOGIT_BYTES = 4
"""The loss reads logits in fp32."""
LOSS_PASSES = 3
"""Elementwise passes over the logits per token in the loss (forward: write, max/sum, log-softmax; the
backward does as many)."""


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """A decoder-only model's shape, as its config gives it."""

    name: str
    """Label for reports (``"Qwen3-1.7B"``)."""
    num_layers: int
    """Decoder layers."""
    hidden: int
    """Model width."""
    intermediate: int
    """Dense MLP width (SwiGLU: gate, up and down projections)."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (grouped-query attention when fewer than ``heads``)."""
    vocab: int
    """Vocabulary: the embedding's rows and the LM head's outputs."""
    head_dim: int | None = None
    """Per-head width; None means hidden // heads (Qwen3 sets 128 explicitly)."""
    experts: int | None = None
    """MoE: routed experts per layer (None for a dense MLP)."""
    top_k: int | None = None
    """MoE: experts each token runs through."""
    expert_intermediate: int | None = None
    """MoE: each expert's MLP width (None means ``intermediate``)."""
    tied_embeddings: bool = False
    """The LM head reuses the embedding matrix (config ``tie_word_embeddings``): one copy of it is stored,
    trained and updated, though both layers still read it (and a round-robin job still uploads it)."""
    source: str = ""
    """Where the numbers come from (the published config file)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerShape.{name} must be a positive int, got {value!r}")
        for name in ("head_dim", "expert_intermediate"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"TransformerShape.{name} must be a positive int or None (None: "
                                 f"{'hidden // heads' if name == 'head_dim' else 'intermediate'}), got {value!r}")
        if (self.experts is None) != (self.top_k is None):
            raise ValueError("give both experts and top_k for a MoE shape, or neither for a dense one")
        if self.experts is not None and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be between 1 and experts={self.experts}, got {self.top_k}")

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def attention_params(self) -> int:
        q_width, kv_width = self.heads * self.dim, self.kv_heads * self.dim
        return self.hidden * (2 * q_width + 2 * kv_width)

    def mlp_params(self) -> tuple[int, int]:
        """(stored, active per token) MLP parameters, router included for MoE."""
        if self.experts is None:
            dense = 3 * self.hidden * self.intermediate
            return dense, dense
        width = self.expert_intermediate or self.intermediate
        expert = 3 * self.hidden * width
        router = self.hidden * self.experts
        return self.experts * expert + router, self.top_k * expert + router

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def layer_params(self) -> int:
        """Stored parameters of one decoder layer: attention, MLP (every expert and the router), two norms."""
        return self.attention_params() + self.mlp_params()[0] + 2 * self.hidden

    def parameter_count(self) -> int:
        """Stored parameters of the whole model (the final norm included; a tied head counted once)."""
        heads = 1 if self.tied_embeddings else 2
        return self.num_layers * self.layer_params() + heads * self.embedding_params() + self.hidden

    def active_parameter_count(self) -> int:
        """Parameters one token runs through (MoE: ``top_k`` experts of each layer)."""
        dense = self.attention_params() + self.mlp_params()[1] + 2 * self.hidden
        heads = 1 if self.tied_embeddings else 2
        return self.num_layers * dense + heads * self.embedding_params() + self.hidden

    def active_mlp_width(self) -> int:
        if self.experts is None:
            return self.intermediate
        return self.top_k * (self.expert_intermediate or self.intermediate)


def _ms(flops: float, hardware: Hardware) -> float:
    return flops / hardware.flops_per_ms


def _decoder_layer(shape: TransformerShape, hw: Hardware, index: int, tokens: int, seq_len: int,
                   dtype_bytes: int) -> LayerCost:
    mlp_stored, mlp_active = shape.mlp_params()
    matmul = 2 * (shape.attention_params() + mlp_active) * tokens
    attention = 2 * shape.heads * shape.dim * seq_len * tokens
    h, q, kv = shape.hidden, shape.heads * shape.dim, shape.kv_heads * shape.dim
    # What autograd keeps with a fused (flash) attention: each norm's and matmul's input, q/k/v, the
    # attention output, and the MLP's gate, up and activation outputs.
    saved = dtype_bytes * (4 * h + 2 * q + 2 * kv + 3 * shape.active_mlp_width())
    return LayerCost(
        name=f"layers.{index}",
        forward=_ms(matmul + attention, hw),
        input_grad=_ms(matmul + 2 * attention, hw),
        weight_grad=_ms(matmul, hw),
        param_bytes=(shape.attention_params() + mlp_stored + 2 * h) * dtype_bytes,
        activation_bytes_per_token=saved,
        output_bytes_per_token=h * dtype_bytes,
    )


def _embedding(shape: TransformerShape, hw: Hardware, tokens: int, dtype_bytes: int) -> LayerCost:
    row = shape.hidden * dtype_bytes
    table = shape.vocab * row
    return LayerCost(
        name="embed",
        forward=tokens * 2 * row / hw.bytes_per_ms,  # gather: read a row, write it
        input_grad=0.0,  # token ids take no gradient
        weight_grad=(table + tokens * 3 * row) / hw.bytes_per_ms,  # zero the dense gradient, scatter-add
        param_bytes=table,
        activation_bytes_per_token=8,  # the int64 token id
        output_bytes_per_token=row,
    )


def _lm_head(shape: TransformerShape, hw: Hardware, tokens: int, dtype_bytes: int,
             loss_chunk_tokens: int | None, shards: int) -> list[LayerCost]:
    """The final norm, vocabulary projection and loss; as ``shards`` vocabulary slices when asked.

    A sliced head passes the hidden state along with a running max, sum of exponentials and target
    logit per token (an online softmax), so the loss comes out exact on the last slice.
    """
    vocab = shape.vocab / shards
    matmul = 2 * shape.hidden * vocab * tokens
    loss = tokens * vocab * LOGIT_BYTES * LOSS_PASSES / hw.bytes_per_ms
    kept_logits = vocab * LOGIT_BYTES
    if loss_chunk_tokens is not None:
        # The loss and its gradient are computed chunk by chunk, so only one chunk's logits exist at once.
        kept_logits = kept_logits * min(loss_chunk_tokens, tokens) / tokens
    running = shape.hidden * dtype_bytes + 3 * LOGIT_BYTES
    return [
        LayerCost(
            name="lm_head" if shards == 1 else f"lm_head.{k}",
            forward=_ms(matmul, hw) + loss,
            input_grad=_ms(matmul, hw) + loss,
            weight_grad=_ms(matmul, hw),
            param_bytes=(vocab + (1 if k == 0 else 0)) * shape.hidden * dtype_bytes,
            activation_bytes_per_token=shape.hidden * dtype_bytes + kept_logits,
            output_bytes_per_token=LOGIT_BYTES if k == shards - 1 else running,  # the loss, or the running state
        )
        for k in range(shards)
    ]


def analytic_profile(shape: TransformerShape, hardware: Hardware, *, seq_len: int, micro_batch_size: int = 1,
                     dtype_bytes: int = 2, loss_chunk_tokens: int | None = None,
                     state_bytes_per_param_byte: float = 1.0, microbatches_in_flight: int = 1,
                     lm_head_shards: int = 1) -> Profile:
    """A profile of ``shape`` on ``hardware`` for micro-batches of ``micro_batch_size`` x ``seq_len`` tokens.

    ``loss_chunk_tokens``: compute the loss in chunks of this many tokens (RoundPipe uses 4,096), which
    shrinks the LM head's memory, not its time. ``lm_head_shards``: model the head as that many
    vocabulary slices that can sit on different stages (a cost model: the runtime has no sliced head
    yet). The other keywords go to ``Profile`` as they are.
    """
    if not isinstance(lm_head_shards, int) or lm_head_shards < 1:
        raise ValueError(f"lm_head_shards must be a positive int, got {lm_head_shards!r}")
    if not isinstance(seq_len, int) or seq_len < 1 or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"seq_len and micro_batch_size must be positive ints, got {seq_len!r}, {micro_batch_size!r}")
    if isinstance(dtype_bytes, bool) or not isinstance(dtype_bytes, int) or dtype_bytes < 1:
        raise ValueError(f"dtype_bytes is the bytes of one weight or activation element (2 for bf16), a positive "
                         f"int; got {dtype_bytes!r}")
    if loss_chunk_tokens is not None and (isinstance(loss_chunk_tokens, bool) or not isinstance(loss_chunk_tokens, int)
                                          or loss_chunk_tokens < 1):
        raise ValueError(f"loss_chunk_tokens is the tokens per loss chunk (RoundPipe uses 4096), a positive int, or "
                         f"None for the whole micro-batch at once; got {loss_chunk_tokens!r}")
    tokens = seq_len * micro_batch_size
    layers = [_embedding(shape, hardware, tokens, dtype_bytes)]
    layers += [_decoder_layer(shape, hardware, i, tokens, seq_len, dtype_bytes) for i in range(shape.num_layers)]
    layers += _lm_head(shape, hardware, tokens, dtype_bytes, loss_chunk_tokens, lm_head_shards)
    return Profile(
        layers=tuple(layers), tokens_per_microbatch=tokens,
        link_bandwidth=hardware.link_bandwidth, host_bandwidth=hardware.host_bandwidth,
        state_bytes_per_param_byte=state_bytes_per_param_byte, microbatches_in_flight=microbatches_in_flight,
        name=f"{shape.name} seq {seq_len} x {micro_batch_size}", source=f"analytic: {hardware.name}",
    )
