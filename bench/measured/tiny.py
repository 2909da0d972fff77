"""The model, data and loss every measured system trains: same initial weights (one seed), same batches.

The model is a list of layers (embedding, decoder layers, norm + LM head) so that every system can use
it as is: the pipelines cut between layers, the data-parallel systems wrap ``nn.Sequential(*layers)``.
The data is next-token prediction on arithmetic sequences (``x_t = a + b t mod vocab``, ``a``, ``b``
drawn per sequence), learnable, so the loss falls and a system that trained a different problem shows.
The loss of a micro-batch is its summed token cross-entropy over the tokens of the whole global batch:
summed over the micro-batches of a step it is the step's mean loss, whichever system sums it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .scenario import Scenario, TinyShape


class Embedding(nn.Module):
    def __init__(self, shape: TinyShape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.hidden)

    def forward(self, tokens):
        return self.embed(tokens)


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention and SwiGLU MLP, each with a residual."""

    def __init__(self, shape: TinyShape) -> None:
        super().__init__()
        self.heads = shape.heads
        self.norm1, self.norm2 = nn.LayerNorm(shape.hidden), nn.LayerNorm(shape.hidden)
        self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden, bias=False)
        self.out = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.gate_up = nn.Linear(shape.hidden, 2 * shape.intermediate, bias=False)
        self.down = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.out(attn)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Head(nn.Module):
    def __init__(self, shape: TinyShape) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(shape.hidden)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, x):
        return self.lm_head(self.norm(x))


def make_layers(scenario: Scenario) -> list[nn.Module]:
    """Fresh layers with the scenario's initial weights (the same on every call and every process)."""
    torch.manual_seed(scenario.seed)
    shape = scenario.model
    return [Embedding(shape), *(DecoderLayer(shape) for _ in range(shape.layers)), Head(shape)]


def batch(scenario: Scenario, step: int, *, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: (inputs, targets), int64, ``global_batch`` x ``seq_len``."""
    seq = seq_len or scenario.seq_len
    g = torch.Generator().manual_seed(scenario.seed * 1_000_003 + step)
    vocab = scenario.model.vocab
    start = torch.randint(0, vocab, (scenario.global_batch, 1), generator=g)
    stride = torch.randint(1, 8, (scenario.global_batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq + 1)) % vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class TokenLoss:
    """Summed cross-entropy of a micro-batch over ``tokens`` (the global batch's), times ``scale``.

    ``scale`` undoes what a data-parallel system does to gradients: averaging over ranks (``world``)
    and, for DeepSpeed, dividing by the accumulation steps. A picklable class, not a closure.
    """

    def __init__(self, tokens: int, scale: float = 1.0) -> None:
        self.tokens, self.scale = tokens, scale

    def __call__(self, logits, targets):
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        return loss * (self.scale / self.tokens)


def adamw(params, scenario: Scenario) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=scenario.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
