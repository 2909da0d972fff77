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
        if isinstance(output, tuple):  # MoE: (logits, router stats[, segments])
            logits, stats, *segments = output
            loss = chunked_cross_entropy(logits, labels, chunk_tokens=self.chunk_tokens)
            if self.aux_loss_coef:
                tokens = _real_tokens(segments[0] if segments else None, logits)
                loss = loss + self.aux_loss_coef * self.aux_loss(stats, tokens=tokens)
            return loss
        return chunked_cross_entropy(output, labels, chunk_tokens=self.chunk_tokens)

    def aux_loss(self, stats: torch.Tensor, *, tokens=None, tokens_per_sample: int | None = None) -> torch.Tensor:
        """Switch-Transformer load balancing from the carried sums, equal to Hugging Face's formula;
        ``tokens``: how many tokens (padding excluded) the sums cover per layer, or ``tokens_per_sample``
        times the samples in ``stats``."""
        if tokens is None:
            tokens = tokens_per_sample * stats.shape[0]
        if self.num_moe_layers == 0 or not isinstance(tokens, torch.Tensor) and tokens == 0:
            return stats.sum() * 0.0
        totals = stats.sum(dim=0) / (self.num_moe_layers * tokens)
        return (totals[0] * totals[1]).sum() * self.num_experts


    def fused_head_backward(self, head, activation, labels: torch.Tensor, *, scale: float = 1.0):
        """Forward and backward of the LM head and this loss, chunk by chunk, for a fused last group.

        ``head`` is a ``HeadLayer`` (final norm + LM head), ``activation`` its input. Each chunk of
        ``chunk_tokens`` tokens computes its logits, its share of the (scaled) loss and that share's
        backward before the next chunk starts, so the full logits never exist at once (RoundPipe's
        4,096-token chunks) and neither does their graph. Returns ``(loss, grads)``: the loss as
        ``scale * self(head(activation), labels)`` would give it (detached), and the gradients of the
        loss with respect to ``activation``'s floating-point tensors (a tuple, in order), ready to continue the
        backward through the layers before the head. The head's parameter gradients accumulate as a
        plain backward would leave them. None when ``head`` is not a ``HeadLayer``.
        """
        from .layers import HeadLayer, unpack

        if not isinstance(head, HeadLayer):
            return None
        hidden, stats, segments = unpack(activation)  # segments carry no gradient: none is returned for them
        moe = stats is not None
        if hidden.shape[:2] != labels.shape:
            raise ValueError(
                f"labels have shape {tuple(labels.shape)} but the hidden states have {tuple(hidden.shape[:2])}: "
                "pass labels aligned with input_ids, shape (batch, seq)"
            )
        hidden = hidden.detach().requires_grad_(True)
        normed = head.norm(hidden)
        flat = normed.detach().reshape(-1, normed.shape[-1]).requires_grad_(True)
        shifted = functional.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].reshape(-1)
        counted = (shifted != IGNORE_INDEX).sum().clamp(min=1)
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, flat.shape[0], self.chunk_tokens):
            logits = head.lm_head(flat[start : start + self.chunk_tokens]).float()
            part = functional.cross_entropy(logits, shifted[start : start + self.chunk_tokens],
                                            ignore_index=IGNORE_INDEX, reduction="sum") / counted
            (part * scale).backward()
            total = total + part.detach()
        normed.backward(flat.grad.view_as(normed))
        if not moe:
            return total * scale, (hidden.grad,)
        stats = stats.detach().requires_grad_(True)
        if self.aux_loss_coef:
            aux = self.aux_loss_coef * self.aux_loss(stats, tokens=_real_tokens(segments, hidden))
            (aux * scale).backward()
            total = total + aux.detach()
        stats_grad = stats.grad if stats.grad is not None else torch.zeros_like(stats)
        return total * scale, (hidden.grad, stats_grad)


def _real_tokens(segments: torch.Tensor | None, like: torch.Tensor):
    """Tokens that are not padding: all of ``like``'s (batch, seq) without segments (at least 1)."""
    if segments is None:
        return like.shape[0] * like.shape[1]
    return (segments > 0).sum().clamp(min=1).to(torch.float32)


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
