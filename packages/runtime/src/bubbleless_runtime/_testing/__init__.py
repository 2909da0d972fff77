"""Private: the project's own test helpers, not part of the API (they may change without notice).

What the runtime's tests and benchmarks build on: a tiny model that exercises every path, its
unpipelined reference, hand-written schedules (split backward, V placement, every stage on one rank),
a tiny Hugging Face config, a one-process stand-in for ``Pipeline``, the CLI in a subprocess, and a model
with one heavy layer for ``partition="auto"``. What runs inside spawned ranks is in ``ranks``.

The tiny model passes a tuple ``(hidden, aux, index)`` between layers: a float tensor, a float
per-sample side sum (as MoE router statistics travel) and an integer tensor that carries no gradient.
Each block mixes a LayerNorm (gradient computed during I) with a Linear (gradient deferred to W).
"""

from __future__ import annotations

import torch
from torch import nn

from bubbleless_schedules import Action, Kind, Schedule, available, generate, v_placement


class Embed(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        index = torch.arange(x.shape[0], device=x.device) % 3
        return self.proj(x), x.new_zeros(x.shape[0]), index


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, activation):
        hidden, aux, index = activation
        out = hidden + torch.tanh(self.linear(self.norm(hidden))) + 0.01 * index.unsqueeze(-1)
        return out, aux + out.pow(2).mean(-1), index


def tiny_model(num_layers: int, width: int = 8, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(Embed(width), *[Block(width) for _ in range(num_layers - 1)]).double().float()


def tiny_loss(output, target):
    hidden, aux, _ = output
    return nn.functional.mse_loss(hidden, target, reduction="sum") + 0.01 * aux.sum()


def tiny_batch(batch: int, width: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def reference_grads(model: nn.Module, inputs, targets, num_microbatches: int, loss_fn=tiny_loss):
    """The unpipelined run: sum over micro-batches of loss_fn(model(x_m), y_m); (loss, {name: grad})."""
    model.zero_grad(set_to_none=True)
    total = sum(loss_fn(model(x), y) for x, y in zip(inputs.chunk(num_microbatches), targets.chunk(num_microbatches),
                                                         strict=True))
    total.backward()
    return total.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def stages_on_one_rank(num_stages: int, num_microbatches: int = 2) -> Schedule:
    """GPipe order with every stage on one rank: a cut (and a partition) without launching processes."""
    forwards = [Action(s, Kind.F, m) for m in range(num_microbatches) for s in range(num_stages)]
    backwards = [Action(s, Kind.B, m) for m in range(num_microbatches) for s in reversed(range(num_stages))]
    return Schedule([forwards + backwards], num_stages=num_stages, num_microbatches=num_microbatches,
                    stage_to_rank=(0,) * num_stages, name=f"{num_stages}-on-one")


# ---- Hugging Face models, the Trainer and the CLI in tests ----


def tiny_hf_fields(**overrides) -> dict:
    """transformers config fields of a 2-layer Qwen3-sized model that builds and runs in milliseconds."""
    fields = dict(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    return {**fields, **overrides}


class SequentialPipeline:
    """One process holding every layer, with the ``Pipeline`` interface the Trainer uses: each micro-batch
    (along dim 0) runs forward and backward in turn and the losses are summed, exactly the gradients
    every real schedule must reproduce."""

    holds_loss = True
    partition = None  # not cut: a checkpoint of it records no stage sizes

    def __init__(self, layers, loss_fn, num_microbatches: int) -> None:
        self.modules = nn.ModuleList(layers)
        self.loss_fn, self.num_microbatches = loss_fn, num_microbatches

    def parameters(self):
        return self.modules.parameters()

    def step(self, inputs, targets):
        total = 0.0
        for x, y in zip(inputs.chunk(self.num_microbatches), targets.chunk(self.num_microbatches), strict=True):
            for layer in self.modules:
                x = layer(x)
            loss = self.loss_fn(x, y)
            loss.backward()
            total = total + loss.detach()
        return total


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for tests that set up their own process group)."""
    from ..launch import _free_port

    return _free_port()


def run_cli(args: list[str], *, timeout: float = 300, torchrun_nproc: int | None = None):
    """``bubbleless`` with ``args`` in a fresh interpreter (one thread per process, no downloads); under
    ``torchrun --standalone --nproc-per-node torchrun_nproc -m bubbleless_runtime.cli`` when given.
    Returns the ``subprocess.CompletedProcess``."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if torchrun_nproc is None:
        command = [sys.executable, "-c", f"from bubbleless_runtime.cli import main; raise SystemExit(main({args!r}))"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun_nproc}",
                   "-m", "bubbleless_runtime.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def split_1f1b(num_ranks: int, num_microbatches: int) -> Schedule:
    """1F1B with each B split into I and a W run one slot later (and the rest at the end)."""
    base = generate("1f1b", num_ranks=num_ranks, num_microbatches=num_microbatches)
    rows = []
    for row in base.actions:
        out, pending = [], []
        for a in row:
            if a.kind is Kind.B:
                out.append(Action(a.stage, Kind.I, a.microbatch))
                out += pending
                pending = [Action(a.stage, Kind.W, a.microbatch)]
            else:
                out.append(a)
        rows.append(out + pending)
    return base.replace(actions=rows, name="split-1f1b")


def v_gpipe(num_ranks: int, num_microbatches: int) -> Schedule:
    """Two stages per rank in a V, GPipe order, split backward: every rank hands one activation to itself."""
    p, m = num_ranks, num_microbatches
    rows = []
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        row = [Action(first, Kind.F, i) for i in range(m)] + [Action(second, Kind.F, i) for i in range(m)]
        row += [Action(second, Kind.I, i) for i in range(m)] + [Action(first, Kind.I, i) for i in range(m)]
        row += [Action(s, Kind.W, i) for s in (second, first) for i in range(m)]
        rows.append(row)
    return Schedule(rows, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p), name="v-gpipe")


def schedules_to_check(num_ranks: int, num_microbatches: int) -> dict:
    """Every registered stage-bound schedule that generates for this shape, plus the hand-written ones."""
    found, skipped = {}, {}
    for name in available():
        try:
            schedule = generate(name, num_ranks=num_ranks, num_microbatches=num_microbatches)
        except (ValueError, NotImplementedError) as exc:
            skipped[name] = str(exc).splitlines()[0]
            continue
        if schedule.stage_to_rank is None:
            skipped[name] = "not stage-bound"
            continue
        found[name] = schedule
    found["split-1f1b"] = split_1f1b(num_ranks, num_microbatches)
    found["v-gpipe"] = v_gpipe(num_ranks, num_microbatches)
    return {"schedules": found, "skipped": skipped}


# ---- partition="auto": a model with one layer about twenty times heavier than the others ----

HEAVY_WIDTH = 16
"""Width of the heavy model's activations: a 16 -> 16384 -> 16 MLP among 16 -> 16 linears, so the profiled
cut differs from the even one whatever the machine's noise."""


def heavy_model(num_layers: int, heavy_at: int, seed: int = 0) -> nn.Sequential:
    """Small tanh layers with one wide MLP at ``heavy_at``."""
    torch.manual_seed(seed)
    layers = [
        nn.Sequential(nn.Linear(HEAVY_WIDTH, 16384), nn.Tanh(), nn.Linear(16384, HEAVY_WIDTH)) if i == heavy_at
        else nn.Sequential(nn.Linear(HEAVY_WIDTH, HEAVY_WIDTH), nn.Tanh())
        for i in range(num_layers)
    ]
    return nn.Sequential(*layers)


def sum_mse(output, target):
    return nn.functional.mse_loss(output, target, reduction="sum")


def heavy_batch(batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, HEAVY_WIDTH, generator=g), torch.randn(batch, HEAVY_WIDTH, generator=g)
