"""Our systems, measured: stage-bound schedules (``Pipeline`` over gloo ranks) and the round-robin pool
(``RoundRobinPipeline`` with CPU devices, one process)."""

from __future__ import annotations

from .common import timed_steps
from .scenario import Scenario
from .tiny import TokenLoss, adamw, batch, make_layers

SCHEDULE_OF = {"bubbleless-1f1b": "1f1b", "zb": "zb", "zbv": "zbv", "zbv-mem": "zbv"}
"""Measured name -> our schedule name (``1f1b`` alone is torch's baseline)."""


def memory_cut(scenario: Scenario, system: str) -> list[int] | None:
    """Layers per stage: None (the even cut) except for ``zbv-mem``, whose cut is the scenario's
    ``zbv_mem_cut``: measured at the start of a run (``vcut.with_measured_cut``: the fastest V cut under
    the layers' profiled costs whose every rank holds no more activations than torch 1F1B's busiest).

    Why not the even cut: a V rank holds up to two micro-batches of both its stages, and the even V cut
    puts n/2 decoder layers on rank 1 (its two middle stages) where 1F1B's busiest rank has n/2 - 1, so
    at the same schedule peak rank 1 holds a third more."""
    if system != "zbv-mem":
        return None
    if scenario.zbv_mem_cut is None:
        raise ValueError("zbv-mem runs on a measured cut: pass the scenario through "
                         "bench.measured.vcut.with_measured_cut first (measure does), or set zbv_mem_cut")
    return list(scenario.zbv_mem_cut)


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
    """``precision="fp32"``: the steps run without autocast, so the pool profiles the layers' bytes in float32
    alone, not also under bf16 and fp16 autocast (its default, for a caller whose autocast it cannot know
    yet): 2 of the 3 byte walks of the build (``pool_precision``, ``pool_kept``). No memory budget is given,
    so the plan follows the timings alone and is the one the default would choose."""
    from bubbleless_runtime import RoundRobinPipeline

    loss_fn = TokenLoss(scenario.global_batch * seq_len)
    x0, _ = batch(scenario, 0, seq_len=seq_len)
    pipe = RoundRobinPipeline(
        make_layers(scenario), devices=["cpu"] * scenario.workers, num_microbatches=scenario.microbatches,
        loss_fn=loss_fn, partition="auto", sample_input=x0[:scenario.micro_batch], trace=False, precision="fp32",
        optimizer={"name": "adamw", "lr": scenario.lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        return float(pipe.step(x, y))

    out = timed_steps(step, steps=steps, warmup=warmup)
    out["device_peak_bytes"] = max(w.budget.peak for w in pipe.workers)
    return out
