"""Our systems, measured: stage-bound schedules (``Pipeline`` over gloo ranks) and the round-robin pool
(``RoundRobinPipeline`` with CPU devices, one process)."""

from __future__ import annotations

from .common import timed_steps
from .scenario import Scenario
from .tiny import TokenLoss, adamw, batch, make_layers

SCHEDULE_OF = {"bubbleless-1f1b": "1f1b", "zb": "zb", "zbv": "zbv"}
"""Measured name -> our schedule name (``1f1b`` alone is torch's baseline)."""


def stage_bound(rank: int, scenario: Scenario, *, system: str, steps: int, warmup: int, seq_len: int,
                interpreter=None) -> dict:
    """``interpreter``: the executor's handler table (default its own; ``bench.measured.memory`` wraps it)."""
    from bubbleless_runtime import Pipeline

    loss_fn = TokenLoss(scenario.global_batch * seq_len)
    pipe = Pipeline(make_layers(scenario), schedule=SCHEDULE_OF[system], num_microbatches=scenario.microbatches,
                    loss_fn=loss_fn, trace=False, interpreter=interpreter)
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
