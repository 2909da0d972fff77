"""The plan the measured round-robin pool runs: the one its cost model prices (bench/modelled/ours_pool.py
``roundrobin`` on the ``cpu`` profile), handed to ``RoundRobinPipeline`` as a ``Profile``.

Why not ``partition="auto"``: the pool then times every layer at start-up (about 99% of the build, 74 s
at sequence 2,048 on this loaded machine) and plans from those timings, which the other agents' load
makes noisy: four builds at sequence 256 gave four plans, the longest-sequence answer moved 1,280-1,792
with the plan, losses differed between rounds in the last digits, and the calibration priced a plan other
than the one that ran. The model's per-layer costs are a pure function of the scenario, so every build
plans the same, in milliseconds, and the calibration's row compares the same plan (``same_plan``).

What the profile carries: the model's F, I, W and R per layer (ms per micro-batch, ``profile_of`` with
the loss chunk the model prices), the analytic parameter and activation bytes, and the host link the
model gives each device (``pool_host_bandwidth``) as both ``host_bandwidth`` and the copy bandwidth the
pool prices LOAD/STORE with (``pool_plan.COPY_BANDWIDTH``; without it the pool would time a copy at
build). It lacks what ``profile_layers`` measures for a memory budget alone (the bytes bounded over
precisions, ``pool_kept``'s kept-until-W bytes): the pool is given no memory budget (the model's is far
above what the tiny model holds, and without one ``auto_groups`` tries what any budget would,
``pool_plan_cap.generated_within``), so the analytic bytes decide nothing.
"""

from __future__ import annotations

from bubbleless_partition import Profile

from .scenario import Scenario
from .tiny import TokenLoss, make_layers


def model_point(scenario: Scenario, *, seq_len: int):
    """The cost model's point for a run of ``scenario`` at ``seq_len``: its shape, workers, batch, fp32, on
    the committed ``cpu`` profile (the calibration's point, ``calibration.calibration_rows``)."""
    from bench.modelled.calibrate import cpu_point

    from .calibration import tiny_shape

    return cpu_point(tiny_shape(scenario), gpus=scenario.workers, seq_len=seq_len, micro_batch=scenario.micro_batch,
                     global_batch=scenario.global_batch, precision="fp32")


def model_profile(scenario: Scenario, *, seq_len: int) -> Profile:
    """The per-layer profile the model plans the pool on (``bench.modelled.ours_pool.pool_profile``), with its
    host link recorded as the pool's copy bandwidth."""
    from bench.modelled.ours_pool import pool_profile
    from bubbleless_runtime.pool_plan import COPY_BANDWIDTH

    point = model_point(scenario, seq_len=seq_len)
    prof = pool_profile(point)
    return prof.with_(extra={**prof.extra, COPY_BANDWIDTH: prof.host_bandwidth},
                      source=f"cost model: {point.hardware.name} profile (bench/measured/rr_plan.py)")


def build_pool(scenario: Scenario, *, seq_len: int, asynchronous: bool = False):
    """The measured pool (``ours.roundrobin``): ``RoundRobinPipeline`` on CPU devices over the scenario's
    layers, planned on ``model_profile`` with no memory budget (the model's is far above what the tiny model
    holds); ``precision="fp32"``: the steps run without autocast. ``asynchronous``: the one-step-stale
    optimizer (``bench.roundrobin.overlap``; the measured systems run the synchronous one)."""
    from bubbleless_runtime import RoundRobinPipeline

    return RoundRobinPipeline(
        make_layers(scenario), devices=["cpu"] * scenario.workers, num_microbatches=scenario.microbatches,
        loss_fn=TokenLoss(scenario.global_batch * seq_len), partition=model_profile(scenario, seq_len=seq_len),
        trace=False, precision="fp32",
        optimizer={"name": "adamw", "lr": scenario.lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                   "asynchronous": asynchronous},
        # asked for what the asynchronous optimizer plans by anyway: the overlap bench runs this plan both as
        # step() in a loop and overlapped, on purpose (no single-step warning)
        schedule_options={"objective": "period"} if asynchronous else None)


def groups_record(groups) -> dict:
    """A ``PoolGroups`` as JSON: the layer counts of the forward groups, the fused last group, the backward."""
    return {"forward": list(groups.forward), "last": groups.last, "backward": list(groups.backward)}


def plan_record(pipe) -> dict:
    """What a built ``RoundRobinPipeline`` runs, for the result JSON: its groups, micro-batches per pool
    step and schedule text (``Schedule.to_text``, which parses back)."""
    return {"groups": groups_record(pipe.groups), "microbatches_per_pool_step": pipe.num_microbatches,
            "schedule": pipe.schedule.to_text()}


def model_plan(scenario: Scenario, *, seq_len: int) -> dict:
    """The plan the model prices at this run's point: the fastest over its pool-step sizes
    (``bench.modelled.ours_pool._pool_plan``), groups and micro-batches per pool step as ``plan_record``."""
    from bench.modelled.ours_pool import _pool_plan

    plan = _pool_plan(model_point(scenario, seq_len=seq_len))
    return {"groups": groups_record(plan[0]), "microbatches_per_pool_step": plan[4]}


def same_plan(ran: dict | None, priced: dict) -> str | None:
    """None when the plan that ran (``plan_record``) is the one the model prices (``model_plan``), else why
    not, in words; a run without a record did not say what it ran."""
    if ran is None:
        return "the run recorded no plan"
    differ = [key for key in ("groups", "microbatches_per_pool_step") if ran.get(key) != priced[key]]
    if not differ:
        return None
    return "; ".join(f"{key}: ran {ran.get(key)}, priced {priced[key]}" for key in differ)
