"""Tiny layer lists for the offload tests: an embedding tied to the LM head, blocks with a buffer."""

from __future__ import annotations

import torch
from torch import nn

VOCAB, DIM = 11, 8


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)

    def forward(self, tokens):
        return self.emb(tokens)


class Block(nn.Module):
    """Linear + LayerNorm with a buffer, so shells have buffers to carry."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.register_buffer("gain", torch.full((DIM,), 0.5))

    def forward(self, x):
        return x + self.norm(torch.tanh(self.linear(x))) * self.gain


class Head(nn.Module):
    """LM head whose weight is the embedding's (tied), as in small Qwen3/Llama models."""

    def __init__(self, embed: Embed) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.proj = nn.Linear(DIM, VOCAB, bias=False)
        self.proj.weight = embed.emb.weight

    def forward(self, x):
        return self.proj(self.norm(x))


def tied_layers(*, seed: int = 0, blocks: int = 2, dtype: torch.dtype = torch.float32) -> list[nn.Module]:
    """[Embed, Block * blocks, Head]: layer 0 and the last share one weight."""
    torch.manual_seed(seed)
    embed = Embed()
    layers = [embed, *(Block() for _ in range(blocks)), Head(embed)]
    return [layer.to(dtype) for layer in layers]


def batch(seed: int, *, size: int = 3, length: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, length), generator=generator)
    targets = torch.randint(0, VOCAB, (size, length), generator=generator)
    return tokens, targets


def loss_of(modules, tokens, targets) -> torch.Tensor:
    x = tokens
    for module in modules:
        x = module(x)
    return nn.functional.cross_entropy(x.float().flatten(0, 1), targets.flatten())


def reference_grads(layers, batches) -> dict[int, torch.Tensor]:
    """id(param) -> grad after one plain backward per batch, in order (as a caller's own loop would)."""
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    for tokens, targets in batches:
        loss_of(layers, tokens, targets).backward()
    grads = {id(p): p.grad.clone() for layer in layers for p in layer.parameters() if p.grad is not None}
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return grads
