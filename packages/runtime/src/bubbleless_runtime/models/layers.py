"""Hugging Face causal LMs cut into pipeline layers: [embedding, decoder layers..., final norm + LM head].

Every layer is an ``nn.Module`` that takes and returns the activation, so any schedule can put the cut
anywhere. Dense models pass ``hidden_states``; MoE models pass ``(hidden_states, router_stats)`` where
``router_stats`` has shape ``(batch, 2, num_experts)``: per sample, row 0 counts the top-k assignments
and row 1 sums the router probabilities over every token and every MoE layer seen so far. Carrying these
sums (not a per-layer loss) is what lets the last stage compute exactly Hugging Face's load-balancing loss,
which multiplies layer-averaged counts by layer-averaged probabilities. The batch dimension comes first so
micro-batching along dim 0 splits the stats with the tokens.

Rotary embeddings and the causal mask are recomputed inside each decoder wrapper from the sequence
length: they are cheap, and recomputing them keeps the activation crossing a stage boundary small.

Packed and padded batches: the first layer also takes ``(input_ids, segments)``, ``segments`` an int64
``(batch, seq)`` tensor numbering the documents of each row from 1, with 0 for padding
(``data_packing``; for one document per row it is Hugging Face's ``attention_mask``). ``segments`` then
travels last in the activation tuple (``(hidden, segments)``, ``(hidden, router_stats, segments)``), to
every stage with the hidden states (it carries no gradient), and each decoder layer builds from it the
per-document causal mask (a token attends to earlier tokens of its own document only) and position ids
that restart at 0 with each document: what Hugging Face computes for the same batch given its
attention mask or restarting position ids. Without ``segments`` only the causal mask is built. The MoE
router statistics leave padding out (as Hugging Face's load-balancing loss given an attention mask does),
so for MoE the head passes the segments on to the loss, which averages over the real tokens.
The wrappers hold references to the Hugging Face modules (no copies), so the parameter names of the
original model, and LoRA adapters injected by peft before or after the cut, stay valid.
"""

from __future__ import annotations

import torch
from torch import nn


def unpack(activation):
    """(hidden, router stats or None, segments or None) of an activation between layers."""
    if not isinstance(activation, tuple):
        return activation, None, None
    hidden, *rest = activation
    segments = rest.pop() if rest and not rest[-1].is_floating_point() else None
    return hidden, (rest[0] if rest else None), segments


def repack(hidden, stats, segments):
    """The activation of (hidden, router stats or None, segments or None): a tensor when alone."""
    parts = (hidden, *(t for t in (stats, segments) if t is not None))
    return parts if len(parts) > 1 else hidden


def positions_of(segments: torch.Tensor) -> torch.Tensor:
    """Position ids restarting at 0 where each document (and the padding) of a row starts."""
    index = torch.arange(segments.shape[-1], device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[..., 1:] = segments[..., 1:] != segments[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - first


class EmbeddingLayer(nn.Module):
    """Token ids ``(batch, seq)``, or ``(input_ids, segments)`` -> hidden states (plus zeroed router stats
    for MoE models, and the segments when given)."""

    def __init__(self, embed_tokens: nn.Embedding, *, num_experts: int = 0) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.num_experts = num_experts

    def forward(self, inputs):
        input_ids, segments = inputs if isinstance(inputs, (tuple, list)) else (inputs, None)
        hidden = self.embed_tokens(input_ids)
        stats = None
        if self.num_experts:
            stats = hidden.new_zeros(input_ids.shape[0], 2, self.num_experts, dtype=torch.float32)
        return repack(hidden, stats, segments)


class DecoderLayer(nn.Module):
    """One Hugging Face decoder layer with its own rotary embedding and causal mask."""

    def __init__(self, layer: nn.Module, *, rotary_emb: nn.Module, config, layer_index: int) -> None:
        super().__init__()
        self.layer = layer
        # Not registered as a submodule: it holds no parameters, and one instance serves every layer.
        object.__setattr__(self, "rotary_emb", rotary_emb)
        object.__setattr__(self, "config", config)
        layer_types = getattr(config, "layer_types", None)
        if layer_types:
            self.sliding = layer_types[layer_index] == "sliding_attention"
        else:  # Mistral: one sliding_window for every layer, None for full attention
            self.sliding = getattr(config, "sliding_window", None) is not None
        self.router = _router_of(layer)
        self.num_experts = getattr(config, "num_experts", 0) or 0
        self.top_k = getattr(config, "num_experts_per_tok", 0) or 0

    def forward(self, activation):
        hidden, stats, segments = unpack(activation)
        mask, position_embeddings, position_ids = self._attention_inputs(hidden, segments)
        captured: list[torch.Tensor] = []
        handle = None
        if self.router is not None:
            handle = self.router.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
        try:
            hidden = self.layer(
                hidden,
                attention_mask=mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
            )
        finally:
            if handle is not None:
                handle.remove()
        if isinstance(hidden, tuple):  # older transformers return (hidden_states, ...)
            hidden = hidden[0]
        if stats is not None:
            for router_logits in captured:
                stats = stats + self._router_stats(router_logits, hidden.shape[0], segments)
        return repack(hidden, stats, segments)

    def _attention_inputs(self, hidden: torch.Tensor, segments: torch.Tensor | None):
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
            packed_sequence_mask_function,
        )

        make_mask = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        if segments is None:
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                             position_ids=positions)
        else:
            positions = positions_of(segments)
            # The mask is given the segments, not the restarting positions: from positions Hugging Face would
            # detect the packing itself and then call every mask function with positions in place of token
            # indices, which would look the segments up at the wrong tokens.
            mask = make_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                             position_ids=None, and_mask_function=packed_sequence_mask_function(segments))
        return mask, self.rotary_emb(hidden, positions), positions

    def _router_stats(self, router_logits: torch.Tensor, batch: int, segments: torch.Tensor | None) -> torch.Tensor:
        """Per-sample top-k counts and probability sums, as Hugging Face's load_balancing_loss_func adds them
        (padding, segment 0, left out as its attention mask leaves it out)."""
        probs = torch.softmax(router_logits, dim=-1)
        _, selected = torch.topk(probs, self.top_k, dim=-1)
        counts = nn.functional.one_hot(selected, self.num_experts).sum(dim=-2).to(torch.float32)
        probs = probs.float()
        if segments is not None:
            keep = (segments.reshape(-1, 1) > 0).to(torch.float32)
            counts, probs = counts * keep, probs * keep
        counts = counts.view(batch, -1, self.num_experts).sum(dim=1)
        prob_sums = probs.view(batch, -1, self.num_experts).sum(dim=1)
        return torch.stack([counts, prob_sums], dim=1)


class HeadLayer(nn.Module):
    """Final norm + LM head: hidden states -> logits (for MoE: with the router stats, and the segments when given)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, activation):
        hidden, stats, segments = unpack(activation)
        logits = self.lm_head(self.norm(hidden))
        if stats is None:  # dense: the segments end here, the loss needs only labels
            return logits
        # MoE: the load-balancing loss averages over real tokens, which the segments count
        return (logits, stats) if segments is None else (logits, stats, segments)


def _router_of(layer: nn.Module) -> nn.Module | None:
    """The MoE router (``mlp.gate`` returning logits first) of a decoder layer, None for dense MLPs."""
    mlp = getattr(layer, "mlp", None)
    if mlp is None or not hasattr(mlp, "experts"):
        return None
    return getattr(mlp, "gate", None)


def cut_causal_lm(model: nn.Module) -> list[nn.Module]:
    """Cut a Hugging Face ``*ForCausalLM`` (or a peft model wrapping one) into pipeline layers.

    The layers share the model's modules: training them trains ``model``, and ``model.save_pretrained``
    (or peft's) saves what they learned.
    """
    causal_lm = _unwrap_peft(model)
    base = getattr(causal_lm, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, n) for n in needed) or not hasattr(causal_lm, "lm_head"):
        raise ValueError(
            f"cannot cut {type(causal_lm).__name__}: expected a *ForCausalLM with .model.embed_tokens, "
            ".model.layers, .model.norm, .model.rotary_emb and .lm_head (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral)"
        )
    config = causal_lm.config
    num_experts = getattr(config, "num_experts", 0) or 0
    decoders = [
        DecoderLayer(layer, rotary_emb=base.rotary_emb, config=config, layer_index=i)
        for i, layer in enumerate(base.layers[: config.num_hidden_layers])
    ]
    moe = num_experts and any(d.router is not None for d in decoders)
    return [
        EmbeddingLayer(base.embed_tokens, num_experts=num_experts if moe else 0),
        *decoders,
        HeadLayer(base.norm, causal_lm.lm_head),
    ]


def count_moe_layers(layers: list[nn.Module]) -> int:
    """How many decoder layers route through experts (the load-balancing loss averages over them)."""
    return sum(1 for layer in layers if isinstance(layer, DecoderLayer) and layer.router is not None)


def _unwrap_peft(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
