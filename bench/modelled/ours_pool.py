"""Our round-robin device pool, modelled with our own planners and simulator: what ``RoundRobinPipeline``
would plan and run (the stage-bound schedules: ``ours.py``).

**Round-robin** (``roundrobin``): what ``RoundRobinPipeline(partition=<analytic profile>)`` plans:
``bubbleless_runtime.pool_plan.auto_groups`` cuts 1 .. 3 x GPUs backward groups (``cut(method=
"roundrobin")``) and also asks the ``roundrobin`` generator for its own cut and dispatch from the
per-layer costs (tapered groups, recompute ahead into waits, the pacing job's micro-batches split over
GPUs; under the GPU's memory its own plan and, per dispatch, that of the largest weight limit that fits:
``pool_plan_cap.generated_within``), prices each job with ``pool_plan.job_costs`` (LOAD = the group's weights over the host link,
STORE = its gradients back; a split job pays both on each of its GPUs), and keeps, among the plans that
fit the GPU, the one ``RoundRobinPipeline`` keeps for the headline's asynchronous optimizer: on a GPU
profile the shortest overlapped steady period (``objective="period"``, ``pool_plan.plan_judge``:
``pool_steady_state`` over ``JUDGED_ITERATIONS`` steps, uploads on the copy stream), on a ``cpu`` profile
(calibrated on synchronous runs) the shortest simulated step (``simulate``: one pool step alone, each LOAD
in its device's compute order). Ranking by the period raised the five ``bench.check`` points' tokens/s by
0 to +3.5% (none lower) and about doubles the planning (55-88 s a point against 25-45 s on the build VM).

**Round-robin, synchronous optimizer** (``roundrobin-sync``): ``RoundRobinPipeline``'s default, planned as
it plans for it: ``auto_groups`` ranks by one pool step's makespan (``objective="makespan"``), ``step()``
runs the pool steps one at a time (on a GPU profile each LOAD on its copy stream, ``single_ms``), then the
CPU AdamW runs with nothing beside it. Within one pool-step size the plan is ``auto_groups``' (ranked, as the
runtime ranks them, by the makespan with each LOAD in its device's compute order); between sizes (how many
micro-batches a pool step takes: the user's choice, which the runtime does not make) by ``single_ms``. A separate system because it is a separate plan: the headline's
period plan stepped one pool step at a time understated it (Llama-3.1-8B on 8 RTX 4090s, 2026-12-04:
1.02x the best baseline against the makespan plan's 1.16x). On a ``cpu`` profile it is ``roundrobin``'s
own plan and step. Assumptions (both round-robin systems):

- host link per GPU: the achieved PCIe rate, or the GPUs' share of half the host's DRAM bandwidth if
  that is less (every GPU streams weights at once; the other half is left to the CPU and activations).
- on a GPU profile the pool steps are overlapped as ``RoundRobinPipeline.steps(batches, accumulate=n)``
  runs them (``bubbleless_runtime.pool_overlap``): the step's compute is n x the steady period of
  back-to-back pool steps, ``pool_steady_state(schedule, costs, load_stream=True)`` (first free, two steps
  in flight, no upload of a device's next row before it frees) over ``STEADY_ITERATIONS`` pool steps: each device,
  as it ends its row of pool step k, takes the next row of step k + 1 not yet taken (the first-free
  rule), within a row the next job's weights upload on the copy stream under the two-job budget, the
  first job of a device's next row uploads only once the device has ended its previous row, and step
  k + 2 starts once step k has ended everywhere. Not priced: the caller's thread between steps (the
  loss, the hand-off below, launching the next step), and two steps' boards in host memory at once.
  ``details``: ``steady_step_s`` (the headline's compute), ``single_step_s`` (pool steps one at a time,
  LOADs on the copy stream: ``step()`` in a loop, the synchronous optimizer's compute) and
  ``serial_loads_step_s`` (one at a time, each LOAD in the compute order: what this model priced before
  the overlap, and still the prediction on a ``cpu`` profile).
- a step of the global batch is one or more pool steps (gradients accumulated): every divisor of the
  batch's micro-batches that gives each GPU at least one is tried, the fastest by the step's compute
  kept. One long pool step puts all micro-batches of the fused last group (the LM head) on one GPU;
  shorter ones deal those jobs to different GPUs but upload every job's weights once per pool step (and,
  one at a time, pay a ramp each; overlapped, the ramp is hidden behind the step before).
- activation hand-off through pinned host memory: the simulator's ``comm`` is one boundary activation
  down and up again at that link rate.
- a STORE's host adds (its gradients into the fp32 accumulators) are not priced: the pool runs them on
  the store's adds thread (``bubbleless_offload.GradientAdds``) beside the devices' compute, and their
  DRAM traffic (about 10 bytes per parameter per STORE) is assumed to fit beside the copies.
- the optimizer: ``HostOptimizer``'s CPU AdamW over every trained parameter, which runs torch's fused CPU
  kernel (one pass, as DeepSpeed's CPU-Adam: bench/results/cpu_adam.md measured it at 4.7x torch's
  default foreach kernel on the build VM), priced memory-bound like the profile's
  ``cpu_adam_fused_params_per_s`` but at ``HOST_STEP_BYTES`` per parameter instead of its 30: the step
  (read param, grad, both moments; write param and moments: 28), the gradient norm (read the grad: 4),
  the working bf16 copy (read the master, write 2 bytes: 6) and zeroing the spent accumulator (4).
- the headline is the one-step-stale optimizer (``optimizer={..., "asynchronous": True}``, RoundPipe's
  default, which ``steps()`` requires): the CPU step of the previous batch's gradients runs on a thread
  during this batch's compute, so the step is max(compute, optimizer) plus the serial hand-off (swap the
  accumulators, start the thread, swap the working buffers in: pointer swaps, ``HAND_OFF_S_PER_LAYER``
  per layer, measured on the build VM). The synchronous step (``RoundRobinPipeline``'s default:
  ``step()`` per pool step, then the optimizer) is ``roundrobin-sync``, planned for it. On a
  ``cpu`` profile the prediction is the synchronous step, pool steps one at a time, LOADs in order:
  the measured CPU runs it is calibrated against (bench/measured) use the synchronous optimizer, and
  there the thread shares the cores the "devices" compute on, which the model does not price (measured
  on the build VM it hid all of a step shorter than the compute: bench/results/async_overlap.md). The
  thread's DRAM traffic is assumed to fit beside the GPUs' copies (``POOL_DMA_SHARE`` leaves half the
  bandwidth to the CPU, the profile's fused rate assumes half).
- peak memory per GPU: ``pool_plan.plan_peak_bytes`` of the plan (walking each GPU's actions: the
  weights of the jobs it holds at once as the pool holds them, the open ones and the prefetched
  (``held_weights``' rule), a split job's on each of its GPUs; the saved activations of every micro-batch
  recomputed and not yet backpropagated there, two or more when the plan recomputes ahead or defers W,
  each with its uploaded input in full and the gradient it hands down; a forward job's input while its
  F runs), plus one loss chunk. ``auto_groups`` refuses every plan whose ``plan_peak_bytes`` is over
  the GPU's usable bytes less the chunk, so the peak reported is the one the plan was chosen under.
  Overlapped pool steps add nothing to it: a device's next row starts with nothing of the last held
  (its first upload waits until that row has ended). The longest sequence assumes the cut a long-sequence user would pick: one layer per group.
- the cut: ``auto_groups``; where none of its plans fits (the 235B MoE's 5 GB layers on a 24 GB GPU:
  the generator's candidate cuts pack several layers per forward group), the smallest count of backward
  groups past 3 x GPUs that fits and the next three, as a user would pass them.
- host memory is assumed large enough for every weight, gradient and optimizer state.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from bubbleless_partition import cut
from bubbleless_schedules import Kind, simulate
from bubbleless_schedules.simulate_steady import pool_steady_state

from .common import (
    LOSS_CHUNK_TOKENS,
    Point,
    Prediction,
    done,
    hidden_bytes,
    logits_bytes,
    longest_sequence,
    not_fitting,
    profile_of,
    trainable_params,
    usable_bytes,
)
from .registry import register

POOL_DMA_SHARE = 0.5
"""Assumed share of the host's DRAM bandwidth the GPUs' copies get together."""


def pool_host_bandwidth(point: Point) -> float:
    """GB/s each pool GPU gets from host memory when all stream at once."""
    hw = point.hardware
    share = math.inf if hw.host_memory_bandwidth is None else hw.host_memory_bandwidth * POOL_DMA_SHARE / point.gpus
    return min(hw.host_bandwidth, share)


def _pool_peak_one_layer_groups(point: Point, seq_len: int) -> float:
    prof = profile_of(point, loss_chunk_tokens=LOSS_CHUNK_TOKENS, seq_len=seq_len)
    tokens = seq_len * point.micro_batch
    weights = sorted((layer.param_bytes for layer in prof.layers), reverse=True)
    activations = max(layer.activation_bytes_per_token for layer in prof.layers) * tokens
    return (weights[0] + weights[min(1, len(weights) - 1)] + activations
            + logits_bytes(point, tokens, LOSS_CHUNK_TOKENS) + 2 * hidden_bytes(point, tokens))


def pool_step_sizes(point: Point) -> list[int]:
    """Micro-batches per pool step to try: divisors of the step's micro-batches, at least one per GPU unless
    the batch is smaller than the pool. Overlapped, fewer would not leave GPUs idle, but each pool step
    uploads every job's weights once: on 8 RTX 4090s at seq 2048 with 32 micro-batches, 1, 2 or 4 per pool
    step make the overlapped step 39% (qwen3-32b, 4) to 12x (qwen3-235b-a22b, 1) longer than one pool step
    of 32, on all four issue models (2026-12-02), so they are not tried."""
    total = point.microbatches
    return [m for m in range(1, total + 1) if total % m == 0 and m >= min(point.gpus, total)]


class PoolPlan(NamedTuple):
    """The plan ``_pool_plan`` keeps, times in ms over the whole batch (its pool steps together)."""

    groups: object
    """The ``PoolGroups`` of the plan."""
    makespan_ms: float
    """Pool steps one at a time, each LOAD in its device's compute order (``simulate``)."""
    peak_bytes: float
    """``plan_peak_bytes`` of the busiest GPU plus one loss chunk."""
    bandwidth: float
    """GB/s of host link per GPU (``pool_host_bandwidth``)."""
    microbatches: int
    """Micro-batches per pool step."""
    transfer_ms: float
    """Every LOAD and STORE (a split job's on each of its GPUs)."""
    last_ms: float
    """The fused last group's compute alone on its busiest GPU."""
    even_ms: float
    """All jobs' work and transfers spread evenly over the GPUs."""
    single_ms: float
    """Pool steps one at a time, LOADs on their copy streams (``pool_steady_state``'s single iteration)."""
    steady_ms: float
    """Pool steps overlapped as ``RoundRobinPipeline.steps`` runs them: the steady period (``pool_steady_state``
    with ``load_stream=True``) times the pool steps."""
    last_gpus: int
    """GPUs that run some of the fused last group's micro-batches (its weights fit each of them)."""

    def over(self, steps: int) -> PoolPlan:
        """One pool step's plan with its times over ``steps`` pool steps."""
        return self._replace(makespan_ms=self.makespan_ms * steps, transfer_ms=self.transfer_ms * steps,
                             last_ms=self.last_ms * steps, even_ms=self.even_ms * steps,
                             single_ms=self.single_ms * steps, steady_ms=self.steady_ms * steps)

    def compute_ms(self, overlapped: bool) -> float:
        """The step's compute: overlapped pool steps, or (a cpu profile, calibrated on synchronous runs) one
        at a time as ``simulate`` prices them."""
        return self.steady_ms if overlapped else self.makespan_ms


STEADY_ITERATIONS = 12
"""Pool steps simulated back to back for the steady period (mean distance between their ends): qwen3-1.7b
on 8 RTX 4090s at seq 2048, 32 micro-batches per pool step, at 4 the first steps' ramp shortens it by 2.2%
against 24, at 12 by 0.35% (the other three models: the same period at 12 and 24)."""


@lru_cache(maxsize=256)
def _pool_plan(point: Point, synchronous: bool = False) -> PoolPlan:
    """The fastest of ``pool_step_sizes`` by the step's compute (``PoolPlan.compute_ms``), each planned for
    the headline's asynchronous optimizer, or with ``synchronous`` for ``step()`` one pool step at a time
    (``_plan_options``); a cpu profile plans both alike, so ``synchronous`` is the same plan there."""
    if synchronous and not _overlaps(point):
        return _pool_plan(point)
    best = None
    for size in pool_step_sizes(point):
        plan = _pool_plan_at(point, size, synchronous=synchronous).over(point.microbatches // size)
        if best is None or _compute_ms(plan, point, synchronous) < _compute_ms(best, point, synchronous) - 1e-9:
            best = plan
    return best


def _compute_ms(plan: PoolPlan, point: Point, synchronous: bool) -> float:
    """The step's compute as the optimizer runs it: ``step()`` one pool step at a time with the synchronous
    optimizer on a GPU (LOADs on the copy stream), else ``PoolPlan.compute_ms``."""
    if synchronous and _overlaps(point):
        return plan.single_ms
    return plan.compute_ms(_overlaps(point))  # a cpu profile: one pool step at a time, LOADs in order


def _overlaps(point: Point) -> bool:
    """Whether the headline overlaps pool steps and the optimizer (GPU profiles; the module docstring)."""
    return point.hardware.kind != "cpu"


def pool_profile(point: Point):
    """The per-layer profile the pool is planned on: ``profile_of`` with the loss chunk the pool runs, and each
    GPU's share of the host link (``pool_host_bandwidth``) as its host bandwidth."""
    return profile_of(point, loss_chunk_tokens=LOSS_CHUNK_TOKENS).with_(host_bandwidth=pool_host_bandwidth(point))


def _plan_options(point: Point, synchronous: bool = False) -> dict:
    """The options ``RoundRobinPipeline`` plans the pool with: ranked by the overlapped steady period where
    pool steps overlap (the headline's asynchronous optimizer on a GPU pool), else (``synchronous``, or a
    cpu profile) by one step's makespan."""
    return {"objective": "period"} if _overlaps(point) and not synchronous else {}


def _pool_plan_at(point: Point, microbatches: int, *, synchronous: bool = False) -> PoolPlan:
    """The plan ``auto_groups`` makes for pool steps of ``microbatches`` (for the synchronous optimizer with
    ``synchronous``), times of one pool step."""
    from bubbleless_runtime.pool_plan import auto_groups, plan_peak_bytes  # torch with it: import on use

    bandwidth = pool_host_bandwidth(point)
    prof = pool_profile(point)
    tokens = point.seq_len * point.micro_batch
    # cut()'s cap is per group; a GPU holds two (auto_groups holds every plan to 2 x cap per GPU, counted by
    # plan_peak_bytes with each held micro-batch's input and handed-down gradient), besides the loss chunk.
    cap = (usable_bytes(point.hardware) - logits_bytes(point, tokens, LOSS_CHUNK_TOKENS)) / 2
    overlaps = _overlaps(point)
    try:
        groups, schedule, costs = auto_groups(
            prof, num_devices=point.gpus, num_microbatches=microbatches, name="roundrobin",
            options=_plan_options(point, synchronous), bandwidth=bandwidth, memory_cap=cap, load_stream=overlaps,
        )
    except ValueError:
        groups, schedule, costs = _more_groups(prof, point, microbatches, bandwidth, cap, synchronous)
    hand_off_ms = 2 * hidden_bytes(point, point.seq_len * point.micro_batch) / (bandwidth * 1e6)
    costs = replace(costs, comm=hand_off_ms)
    timeline = simulate(schedule, costs)
    peak = max(plan_peak_bytes(schedule, prof)) + logits_bytes(point, tokens, LOSS_CHUNK_TOKENS)
    loads = sum(costs.load[a.stage] if a.kind is Kind.LOAD else costs.store[a.stage]
                for _, _, a in schedule.all_actions() if a.kind in (Kind.LOAD, Kind.STORE))  # a split job's on each GPU
    last = groups.last_stage
    per_gpu = [len({a.microbatch for a in row if a.stage == last and a.microbatch is not None})
               for row in schedule.actions]  # the fused group's micro-batches on each GPU (all unsplit)
    busiest = max(per_gpu)
    last_ms = (costs.forward[last] + costs.backward_input[last] + costs.backward_weight[last]) * busiest
    work = sum(costs.backward_input) + sum(costs.backward_weight)  # zero for forward jobs
    work += sum(costs.recompute[j] if groups.role(j) == "backward" else costs.forward[j]
                for j in range(groups.num_stages))  # backward jobs run R, the others F
    even_ms = (work * microbatches + loads) / point.gpus
    overlapped = pool_steady_state(schedule, costs, iterations=STEADY_ITERATIONS, load_stream=True)
    return PoolPlan(groups, timeline.makespan, peak, bandwidth, microbatches, loads, last_ms, even_ms,
                    overlapped.makespan, overlapped.period, sum(n > 0 for n in per_gpu))


def _more_groups(prof, point: Point, microbatches: int, bandwidth: float, cap: float, synchronous: bool = False):
    """When no cut into at most 3 x GPUs groups fits (``auto_groups``' range), what a user passes as
    ``partition=cut(profile, num_stages=n, method="roundrobin")``: the best by ``_plan_options``' objective
    of the smallest group count that fits the cap and the next three."""
    from bubbleless_runtime.pool_plan import (
        generate_pool,
        groups_from_partition,
        job_costs,
        objective_of,
        plan_judge,
    )

    objective, options = objective_of(_plan_options(point, synchronous))
    judge = plan_judge(objective, load_stream=_overlaps(point))

    def attempt(count):
        try:
            return cut(prof, num_stages=count, method="roundrobin", num_microbatches=microbatches, memory_cap=cap)
        except ValueError:
            return None

    low, high = 3 * point.gpus, prof.num_layers  # fewer groups fit less: bisect the smallest count that fits
    if low >= high or attempt(high) is None:
        raise ValueError(f"no round-robin cut into any number of groups keeps a group under {cap / 2**30:.1f} GiB")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if attempt(mid) is not None else (mid, high)
    best = None
    for count in range(high, min(high + 4, prof.num_layers + 1)):
        partition = attempt(count)
        if partition is None:
            continue
        groups = groups_from_partition(partition)
        costs = job_costs(prof, groups, bandwidth=bandwidth)
        schedule = generate_pool("roundrobin", groups, num_layers=prof.num_layers, num_devices=point.gpus,
                                 num_microbatches=microbatches, costs=costs, options=options)
        judged = judge(schedule, costs)
        if best is None or judged < best[0]:
            best = (judged, groups, schedule, costs)
    return best[1], best[2], best[3]


def _runs(sizes) -> str:
    """``[2, 1, 1, 1]`` as ``2, 1x3``: group lists of 96 layers stay readable."""
    out = []
    for size in sizes:
        if out and out[-1][0] == size:
            out[-1][1] += 1
        else:
            out.append([size, 1])
    return "[" + ", ".join(f"{v}x{n}" if n > 1 else str(v) for v, n in out) + "]"


HOST_STEP_BYTES = 42
"""DRAM bytes ``HostOptimizer``'s fused AdamW step moves per parameter (the module docstring)."""
HAND_OFF_S_PER_LAYER = 37e-6
"""The asynchronous optimizer's serial hand-off per decoder layer (11 tensors): ``AsyncHostOptimizer.step``
plus the swap in ``synchronize``, 1.0 ms for 28 layers (308 tensors), median of 30, on the 2-core build VM
(2026-12-01)."""


def host_optimizer_s(point: Point) -> float:
    """Seconds ``HostOptimizer``'s fused CPU AdamW takes over the trained parameters."""
    from bubbleless_partition.hardware_data import ADAM_BYTES_PER_PARAM

    rate = point.hardware.cpu_adam_fused_params_per_s * ADAM_BYTES_PER_PARAM / HOST_STEP_BYTES
    return trainable_params(point) / rate


def _pool_longest(point: Point) -> int:
    """The longest sequence on one-layer groups (the module docstring), either optimizer. A GPU's bytes
    alone: the host memory it needs there (``pool_host_bytes``) is reported beside it, not taken as a limit
    (no hardware profile gives a server's RAM)."""
    return longest_sequence(lambda s: _pool_peak_one_layer_groups(point.at(micro_batch=1), s),
                            usable_bytes(point.hardware))


HOST_STATE_BYTES = {"trainable": 2 + 4 + 4 + 8, "frozen": 2, "asynchronous": 6}
"""Host bytes per parameter ``HostStore`` keeps: a trained one its working bf16 copy, fp32 master, fp32
gradient accumulator and AdamW's two fp32 moments; a frozen one its working copy; the one-step-stale
optimizer 6 more per trained one (a second accumulator and working buffer)."""


def pool_host_bytes(point: Point, seq_len: int, *, asynchronous: bool = True) -> tuple[float, float]:
    """(the model's state, the saved layer inputs) the pool holds in host memory at ``seq_len`` tokens on
    one-layer groups, at least: every backward group's input of one sequence per GPU (a pool step runs at
    least one micro-batch per GPU, and keeps each forward job's input until its backward recomputes it)."""
    trained = trainable_params(point)
    frozen = point.shape.parameter_count() - trained if point.lora_rank is not None else 0.0
    per_trained = HOST_STATE_BYTES["trainable"] + (HOST_STATE_BYTES["asynchronous"] if asynchronous else 0)
    state = trained * per_trained + frozen * HOST_STATE_BYTES["frozen"]
    inputs = point.gpus * (point.shape.num_layers + 1) * hidden_bytes(point, seq_len)
    return state, inputs


def _plan_note(plan: PoolPlan, point: Point, ranked_by: str) -> str:
    groups = plan.groups
    return (f"{point.microbatches // plan.microbatches} pool steps of {plan.microbatches} micro-batches, gradients "
            f"accumulated; groups fwd {_runs(groups.forward)} last {groups.last} bwd {_runs(groups.backward)}; host "
            f"link {plan.bandwidth:.1f} GB/s per GPU; planned by {ranked_by}")


def _plan_details(plan: PoolPlan, point: Point) -> dict:
    """Seconds of the step's parts, and the fused last group's layers and GPUs (the report's prose quotes them)."""
    return dict(single_step_s=_compute_ms(plan, point, synchronous=True) / 1e3, steady_step_s=plan.steady_ms / 1e3,
                serial_loads_step_s=plan.makespan_ms / 1e3, transfer_s_all_jobs=plan.transfer_ms / 1e3,
                fused_last_group_s=plan.last_ms / 1e3, work_spread_evenly_s=plan.even_ms / 1e3,
                fused_last_group_layers=plan.groups.last, fused_last_group_gpus=plan.last_gpus)


def roundrobin(point: Point) -> Prediction:
    """Our round-robin device pool (RoundPipe's mechanism), as ``RoundRobinPipeline`` would plan it, with
    the one-step-stale host optimizer (``asynchronous``) and, on a GPU profile, its pool steps overlapped
    (``RoundRobinPipeline.steps``); the synchronous optimizer is ``roundrobin_synchronous``."""
    try:
        plan = _pool_plan(point)
    except ValueError as error:
        return not_fitting("roundrobin", point, math.inf, _pool_longest(point), f"no plan: {error}")
    overlaps = _overlaps(point)
    compute = plan.compute_ms(overlaps) / 1e3
    single = _compute_ms(plan, point, synchronous=True) / 1e3  # pool steps one at a time: step()
    optimizer = host_optimizer_s(point)
    hand_off = HAND_OFF_S_PER_LAYER * point.shape.num_layers
    step = (max(compute, optimizer) + hand_off) if overlaps else single + optimizer
    steps = point.microbatches // plan.microbatches
    notes = [
        _plan_note(plan, point, "the steady period (objective='period')" if overlaps else "one pool step's makespan"),
        (f"pool steps overlapped (RoundRobinPipeline.steps(batches, accumulate={steps})): compute {compute:.2f} s "
         f"= {steps} x the steady period; one pool step at a time (step()) {single:.2f} s"
         if overlaps else "a cpu profile: pool steps one at a time (step()), LOADs in the compute order"),
        f"one-step-stale optimizer (asynchronous=True, RoundPipe's default; the headline): step "
        f"{step:.2f} s = max(compute {compute:.2f}, CPU AdamW {optimizer:.2f}) + hand-off {hand_off * 1e3:.1f} ms"
        + ("" if overlaps else " (a cpu profile: the synchronous step is the prediction)")
        + f", {point.tokens / step:,.0f} tokens/s; the synchronous optimizer, planned for it: roundrobin-sync",
    ]
    longest = _pool_longest(point)
    return done("roundrobin", point, step, plan.peak_bytes, longest, notes + [_host_note(point, longest)],
                compute_s=compute, optimizer_s=optimizer, hand_off_s=hand_off if overlaps else 0.0,
                **_plan_details(plan, point), **_host_details(point, longest))


def roundrobin_synchronous(point: Point) -> Prediction:
    """The pool with ``RoundRobinPipeline``'s default synchronous optimizer, planned as it plans for it (one
    pool step's makespan), ``step()`` per pool step, then the CPU AdamW (the module docstring)."""
    try:
        plan = _pool_plan(point, synchronous=True)
    except ValueError as error:
        return not_fitting("roundrobin-sync", point, math.inf, _pool_longest(point), f"no plan: {error}")
    compute = _compute_ms(plan, point, synchronous=True) / 1e3
    optimizer = host_optimizer_s(point)
    step = compute + optimizer
    how = "LOADs on the copy stream" if _overlaps(point) else "a cpu profile: LOADs in the compute order"
    notes = [_plan_note(plan, point, "one pool step's makespan (objective='makespan')"),
             f"synchronous optimizer (RoundRobinPipeline's default): step() per pool step ({how}), step {step:.2f} s "
             f"= compute {compute:.2f} + CPU AdamW {optimizer:.2f}, {point.tokens / step:,.0f} tokens/s"]
    longest = _pool_longest(point)
    return done("roundrobin-sync", point, step, plan.peak_bytes, longest,
                notes + [_host_note(point, longest, asynchronous=False)], compute_s=compute, optimizer_s=optimizer,
                hand_off_s=0.0, **_plan_details(plan, point), **_host_details(point, longest, asynchronous=False))


def _host_details(point: Point, longest: int, *, asynchronous: bool = True) -> dict:
    state, inputs = pool_host_bytes(point, max(longest, 1), asynchronous=asynchronous)
    return dict(host_state_bytes=state, host_inputs_bytes_at_max_seq=inputs)


def _host_note(point: Point, longest: int, *, asynchronous: bool = True) -> str:
    state, inputs = pool_host_bytes(point, max(longest, 1), asynchronous=asynchronous)
    return (f"host memory at the longest sequence ({longest:,} tokens), at least: {state / 1e9:,.0f} GB of model "
            f"state + {inputs / 1e9:,.0f} GB of saved layer inputs (one sequence per GPU); not a limit here, no "
            "profile gives a server's RAM")


register("roundrobin", modelled=roundrobin, description="ours: round-robin device pool, host-resident state, "
         "one-step-stale host optimizer")
register("roundrobin-sync", modelled=roundrobin_synchronous,
         description="ours: round-robin device pool, host-resident state, synchronous host optimizer")
