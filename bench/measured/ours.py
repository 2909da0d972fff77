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
    """The pool on the plan its cost model prices at this run's point (``rr_plan.build_pool``: the model's
    per-layer costs as ``partition=``, so every build plans the same, in milliseconds, where
    ``partition="auto"`` timed the layers at start-up on a loaded machine and planned from those); the plan
    that ran goes into the result (``plan``) with the build's seconds (``build_s``), for the calibration
    to check against the plan it prices."""
    import time

    from .rr_plan import build_pool, plan_record

    started = time.perf_counter()
    pipe = build_pool(scenario, seq_len=seq_len)
    build_s = time.perf_counter() - started

    def step(i: int):
        x, y = batch(scenario, i, seq_len=seq_len)
        return float(pipe.step(x, y))

    out = timed_steps(step, steps=steps, warmup=warmup)
    out["device_peak_bytes"] = max(w.budget.peak for w in pipe.workers)
    out["plan"], out["build_s"] = plan_record(pipe), build_s
    return out
