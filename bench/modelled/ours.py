"""Our stage-bound systems, modelled with our own planners and simulator: what the runtime would plan and run.

**Stage-bound schedules** (every name ``bubbleless_schedules`` registers; ``bubbleless-1f1b`` for ours
1F1B): the layers (embedding, decoder layers, LM head) cut by ``bubbleless_partition.cut`` into one
stage per GPU, two per GPU for V-shaped and interleaved schedules; each stage's F, I and W summed from
the analytic profile and handed to the schedule's generator as per-stage costs; the step's compute is
the simulated makespan. The cut is the runtime's (``auto_partition.best_plan``, no memory cap): the
placement's own method (``"v"`` for a V, else ``"dp"``), ``"dp"`` and ``"uniform"``, the fastest
simulated. Assumptions:

- p2p: one boundary activation per micro-batch at the profile's link rate (the peer link where there is
  one, PCIe through host memory on the RTX 4090), as the simulator's one ``comm`` latency (the largest
  cut's); the simulator overlaps nothing else.
- weights, gradients and optimizer state resident on the GPU (16 bytes per parameter in mixed precision);
  the optimizer step runs on the device, memory-bound (30 bytes moved per parameter at device bandwidth);
  on a ``cpu`` profile, ``torch.optim.AdamW``'s default step over the rank's layers at the rates
  ``adam_ops`` measures over the model's own tensors (what the measured CPU runs step).
- no recompute; the loss chunked by 4,096 tokens (our runtime's ``chunked_cross_entropy``).
- the backward split free (I + W = B) except on a profile that carries its measured cost (``split_ops``:
  the ``cpu`` profile), where the split I and W actions and the forwards of split micro-batches carry it
  (``_split_priced``; unsplit B actions do not).
- peak memory per GPU: its stages' state, plus the simulated peak of micro-batches in flight
  (``Timeline.peak_memory``, with I freeing nothing until W: pessimistic for ZB) times one micro-batch's
  saved activations of its layers, plus one loss chunk on the GPU holding the head.

The round-robin pool (``roundrobin``, ``roundrobin-sync``) is modelled in ``ours_pool.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from bubbleless_partition import cut
from bubbleless_schedules import Costs, Kind, available, generate, simulate

from .common import (
    LOSS_CHUNK_TOKENS,
    Point,
    Prediction,
    accumulation_ms,
    done,
    hidden_bytes,
    layer_params,
    logits_bytes,
    longest_sequence,
    not_fitting,
    pipeline_accumulation,
    profile_of,
    rank_optimizer_s,
    state_bytes_per_trainable,
    usable_bytes,
)
from .registry import register

TWO_CHUNKS = {"zbv": "v", "v-half": "v", "v-min": "v", "dualpipev": "v", "interleaved-1f1b": "dp"}
"""Schedules with two stages per GPU -> the cut method that places them."""
OPTIMIZER_BYTES_PER_PARAM = 30
"""Device bytes a fused on-GPU Adam step moves per parameter (as ``hardware_data`` prices CPU Adam)."""


def _stage_state_bytes(point: Point, layers) -> float:
    weights = sum(layer.param_bytes for layer in layers)
    if point.lora_rank is not None:
        return weights  # frozen 16-bit base; the adapters' state is a rounding error
    return weights * state_bytes_per_trainable(point) / point.dtype_bytes


def _device_optimizer_s(point: Point, rank_layers) -> float:
    if point.lora_rank is not None:
        return 0.0
    params = max(sum(layer_params(layer, point) for layer in layers) for layers in rank_layers)
    return params * OPTIMIZER_BYTES_PER_PARAM / (point.hardware.memory_bandwidth * 1e9)


CUT_METHODS = ("dp", "uniform")
"""Cuts tried beside the placement's own method, the fastest simulated kept: what the runtime's
``auto_partition.best_plan`` does with no memory cap (first listed on a tie)."""


@lru_cache(maxsize=256)
def _stage_bound_plan(name: str, point: Point):
    """(sizes, rank layers, simulated makespan in ms, peak micro-batches in flight) of the fastest cut."""
    primary = TWO_CHUNKS.get(name, "dp")
    best = None
    for method in dict.fromkeys((primary, *CUT_METHODS)):
        try:
            plan = _plan_with(name, point, method)
        except ValueError:
            if method == primary:
                raise
            continue
        if best is None or plan[2] < best[2] - 1e-12:
            best = plan
    return best


def _plan_with(name: str, point: Point, method: str):
    prof = profile_of(point, loss_chunk_tokens=LOSS_CHUNK_TOKENS)
    p = point.gpus
    chunks = p * (2 if name in TWO_CHUNKS else 1)
    if chunks > prof.num_layers:
        raise ValueError(f"{chunks} stages are more than the {prof.num_layers} layers")
    part = cut(prof, num_stages=chunks, method=method)
    stages = [part.layers_of(s) for s in range(part.num_stages)]
    costs = Costs(
        tuple(sum(prof.layers[i].forward for i in r) for r in stages),
        tuple(sum(prof.layers[i].input_grad for i in r) for r in stages),
        tuple(sum(prof.layers[i].weight_grad for i in r) for r in stages),
        max((prof.cut_transfer_time(b) for b in part.boundaries), default=0.0),
    )
    schedule = generate(name, num_ranks=p, num_microbatches=point.microbatches, costs=costs)
    measured = getattr(point.hardware, "split_backward", None)
    if measured is not None:  # a cpu profile: price the split the schedule makes, rebuild, until it stays
        accumulation = [0.0 if point.lora_rank is not None else  # LoRA: no W, so nothing accumulated in it
                        sum(accumulation_ms(prof.layers[i], point.hardware.small_ops, pipeline_accumulation(point))
                            for i in r) for r in stages]
        priced = costs
        for _ in range(SPLIT_REBUILDS):
            again = _split_priced(costs, accumulation, schedule, measured)
            if again == priced:
                break
            priced = again
            schedule = generate(name, num_ranks=p, num_microbatches=point.microbatches, costs=priced)
        costs = _split_priced(costs, accumulation, schedule, measured)  # the schedule simulated, by its own split
    timeline = simulate(schedule, costs)
    ranks = [[i for s, r in enumerate(schedule.stage_to_rank) if r == rank for i in stages[s]] for rank in range(p)]
    return part.sizes, ranks, timeline.makespan, timeline.peak_memory


SPLIT_REBUILDS = 4
"""Times the stage-bound plan is rebuilt on the split-priced costs until the split set stays (ZB-V and ZB
split every micro-batch, so their set never moves; DualPipeV's may)."""


@dataclass(frozen=True)
class SplitPricedCosts(Costs):
    """``Costs`` whose B is the unsplit backward's (``whole_backward``, per stage), where I and W carry the
    split's measured cost: a stage that runs some micro-batches whole and splits others (DualPipeV) pays the
    split only on the ones it splits."""

    whole_backward: tuple[float, ...] = ()

    def of(self, kind: Kind, stage: int, stages_per_rank: float = 1.0) -> float:
        if kind is Kind.B:
            return self.whole_backward[stage]
        return super().of(kind, stage, stages_per_rank)


def _split_priced(costs: Costs, accumulation, schedule, measured) -> Costs:
    """``costs`` (per stage) with the runtime's split at its measured cost (``split_ops``: a ``cpu``
    profile's ``split_backward``) on what the schedule splits: I and the compute of W times the split
    backward's ratio (I + W over B), W's gradient accumulation (``accumulation``, ms per stage; measured
    apart: ``split_ops`` times into fresh gradients) as it is, B as the unsplit I + W. F: the simulator
    prices an action by its kind and stage, not its micro-batch, so each stage's F carries the deferred
    forward's extra in the share of its micro-batches it splits (exact over the stage's work; averaged
    over its F actions). ``costs`` as it is where the schedule splits nothing."""
    splits = [0] * schedule.num_stages
    for _, _, action in schedule.all_actions():
        if action.kind is Kind.I:
            splits[action.stage] += 1
    if not any(splits):
        return costs
    share = [n / schedule.num_microbatches for n in splits]
    ratio = measured.backward_ratio
    forward = tuple(f * (1 + (measured.forward_ratio - 1) * share[s]) for s, f in enumerate(costs.forward))
    backward_input = tuple(i * ratio if share[s] else i for s, i in enumerate(costs.backward_input))
    backward_weight = tuple((w - accumulation[s]) * ratio + accumulation[s] if share[s] else w
                            for s, w in enumerate(costs.backward_weight))
    whole = tuple(i + w for i, w in zip(costs.backward_input, costs.backward_weight, strict=True))
    return SplitPricedCosts(forward, backward_input, backward_weight, costs.comm, whole_backward=whole)


def _stage_bound_peak(point: Point, ranks, in_flight, seq_len: int) -> float:
    prof = profile_of(point, loss_chunk_tokens=LOSS_CHUNK_TOKENS, seq_len=seq_len)
    tokens = seq_len * point.micro_batch
    last = prof.num_layers - 1
    peaks = []
    for rank, layer_ids in enumerate(ranks):
        layers = [prof.layers[i] for i in layer_ids]
        activations = sum(layer.activation_bytes_per_token for layer in layers) * tokens
        peak = _stage_state_bytes(point, layers) + in_flight[rank] * activations + 2 * hidden_bytes(point, tokens)
        if last in layer_ids:
            peak += logits_bytes(point, tokens, LOSS_CHUNK_TOKENS)
        peaks.append(peak)
    return max(peaks)


def stage_bound(name: str):
    """The modelled runner for our stage-bound schedule ``name``."""
    system = "bubbleless-1f1b" if name == "1f1b" else name

    def model(point: Point) -> Prediction:
        try:
            sizes, ranks, makespan_ms, in_flight = _stage_bound_plan(name, point)
        except ValueError as error:
            return not_fitting(system, point, math.inf, 0, f"no plan: {error}")
        prof = profile_of(point, loss_chunk_tokens=LOSS_CHUNK_TOKENS)
        measured = rank_optimizer_s(point, prof, ranks)  # a cpu profile: AdamW over the model's tensors
        optimizer = measured if measured is not None else _device_optimizer_s(point, [[prof.layers[i] for i in r] for r in ranks])
        step = makespan_ms / 1e3 + optimizer
        peak = _stage_bound_peak(point, ranks, in_flight, point.seq_len)
        longest = longest_sequence(lambda s: _stage_bound_peak(point.at(micro_batch=1), ranks, in_flight, s),
                                   usable_bytes(point.hardware))
        notes = [f"stages {list(sizes)}; in flight per GPU {list(in_flight)} micro-batches"]
        return done(system, point, step, peak, longest, notes,
                    compute_s=makespan_ms / 1e3, optimizer_s=optimizer)

    model.__doc__ = f"Our stage-bound {name!r} schedule (bench/modelled/ours.py)."
    return model


for _name in available():
    if _name not in ("roundrobin", "auto"):
        register("bubbleless-1f1b" if _name == "1f1b" else _name, modelled=stage_bound(_name),
                 description=f"ours: stage-bound {_name} schedule")
