"""Causal LM loss for the pipeline's last stage: shifted cross-entropy plus the MoE load-balancing loss.

The cross-entropy runs over token chunks so only one chunk of logits is ever upcast to float32 at a
time (a bf16 model with a large vocabulary would otherwise hold a full float32 copy of its logits).
Labels follow the Hugging Face convention: ``labels`` align with ``input_ids`` and are shifted here;
``-100`` marks tokens that carry no loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional

IGNORE_INDEX = -100


@dataclass(frozen=True, kw_only=True)
class CausalLMLoss:
    """``loss_fn(output, labels)`` for ``Pipeline``: mean next-token cross-entropy (+ aux loss for MoE)."""

    num_experts: int = 0
    """Experts per MoE layer; 0 for dense models (then ``output`` is the logits alone)."""
    num_moe_layers: int = 0
    """How many layers added router stats; the load-balancing loss averages over them."""
    aux_loss_coef: float = 0.0
    """Weight of the load-balancing loss (Hugging Face's ``router_aux_loss_coef``)."""
    chunk_tokens: int = 4096
    """Tokens per cross-entropy chunk; bounds the float32 logits held at once."""

    def __call__(self, output, labels: torch.Tensor) -> torch.Tensor:
        if isinstance(output, tuple):
            logits, stats = output
            loss = chunked_cross_entropy(logits, labels, chunk_tokens=self.chunk_tokens)
            if self.aux_loss_coef:
                loss = loss + self.aux_loss_coef * self.aux_loss(stats, tokens_per_sample=logits.shape[1])
            return loss
        return chunked_cross_entropy(output, labels, chunk_tokens=self.chunk_tokens)

    def aux_loss(self, stats: torch.Tensor, *, tokens_per_sample: int) -> torch.Tensor:
        """Switch-Transformer load balancing from the carried sums, equal to Hugging Face's formula."""
        rows = self.num_moe_layers * tokens_per_sample * stats.shape[0]
        if rows == 0:
            return stats.sum() * 0.0
        totals = stats.sum(dim=0) / rows
        return (totals[0] * totals[1]).sum() * self.num_experts


def chunked_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, chunk_tokens: int = 4096
) -> torch.Tensor:
    """Mean cross-entropy of ``logits[:, t]`` predicting ``labels[:, t + 1]``, computed chunk by chunk."""
    if logits.shape[:2] != labels.shape:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)} but logits have {tuple(logits.shape)}: "
            "pass labels aligned with input_ids, shape (batch, seq)"
        )
    shifted = functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].reshape(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    total = logits.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_tokens):
        chunk = flat[start : start + chunk_tokens].float()
        target = shifted[start : start + chunk_tokens]
        total = total + functional.cross_entropy(chunk, target, ignore_index=IGNORE_INDEX, reduction="sum")
    counted = (shifted != IGNORE_INDEX).sum().clamp(min=1)
    return total / counted
