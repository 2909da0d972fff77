"""Our systems, measured: stage-bound schedules (``Pipeline`` over gloo ranks) and the round-robin pool
(``RoundRobinPipeline`` with CPU devices, one process)."""

from __future__ import annotations

from .common import timed_steps
from .scenario import Scenario
from .tiny import TokenLoss, adamw, batch, make_layers

SCHEDULE_OF = {"bubbleless-1f1b": "1f1b", "zb": "zb", "zbv": "zbv", "zbv-mem": "zbv"}
"""Measured name -> our schedule name (``1f1b`` alone is torch's baseline)."""


def memory_cut(scenario: Scenario, system: str) -> list[int] | None:
    """Layers per stage: None (the even cut) except for ``zbv-mem`` on 2 ranks, whose V cut gives each
    rank as many decoder layers as torch's even 1F1B cut does (rank 0: the embedding, 1 layer | n/2 - 2
    layers and the head; rank 1: 1 | n/2 - 2 layers, n = layers + 2).

    Why: activations are the decoder layers' (the embedding saves next to nothing, the head about one
    layer's worth, the logits), and a V rank holds up to two micro-batches of both its stages. The even
    V cut puts n/2 decoder layers on rank 1 (its two middle stages) where 1F1B's busiest rank has
    n/2 - 1, so at the same schedule peak (2 M_B) rank 1 holds a third more; this cut gives it 1F1B's
    share, at the price of rank 0 doing the head's work on top of the same layer count."""
    if system != "zbv-mem":
        return None
    n = scenario.model.layers + 2
    if scenario.workers != 2 or n < 8:
        raise ValueError(f"zbv-mem is defined for 2 workers and at least 6 decoder layers, got "
                         f"{scenario.workers} workers and {scenario.model.layers} layers; measure zbv instead")
    half = n // 2
    return [2, 1, half - 2, n - half - 1]


def stage_bound(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int,
                interpreter=None) -> dict:
    """``interpreter``: the executor's handler table (default its own; ``bench.measured.memory`` wraps it)."""
    from bubbleless_runtime import Pipeline

    loss_fn = TokenLoss(scenario.global_batch * seq_len)
    pipe = Pipeline(make_layers(scenario), schedule=SCHEDULE_OF[system], num_microbatches=scenario.microbatches,
                    loss_fn=loss_fn, trace=False, interpreter=interpreter, partition=memory_cut(scenario, system))
    optimizer = adamw(list(pipe.parameters()), scenario)

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = pipe.step(x, y)
        optimizer.step()
        return None if loss is None else float(loss)

    return timed_steps(step, steps=steps, warmup=warmup)


def roundrobin(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int) -> dict:
    from bubbleless_runtime import RoundRobinPipeline

    loss_fn = TokenLoss(scenario.global_batch * seq_len)
    x0, _ = batch(scenario, 0, seq_len=seq_len)
    pipe = RoundRobinPipeline(
        make_layers(scenario), devices=["cpu"] * scenario.workers, num_microbatches=scenario.microbatches,
        loss_fn=loss_fn, partition="auto", sample_input=x0[:scenario.micro_batch], trace=False,
        optimizer={"name": "adamw", "lr": scenario.lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        return float(pipe.step(x, y))

    out = timed_steps(step, steps=steps, warmup=warmup)
    out["device_peak_bytes"] = max(w.budget.peak for w in pipe.workers)
    return out
