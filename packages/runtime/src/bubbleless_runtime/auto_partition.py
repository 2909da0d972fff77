"""``Pipeline(..., partition="auto")``: measure the layers once, share the profile, cut it for the schedule.

Rank 0 of the pipeline group measures every layer (``bubbleless_partition.profile``) on one sample
micro-batch and broadcasts the *profile*; every rank then runs the same pure ``cut`` on it. Timings
taken on each rank would differ (a shared CPU, a busier GPU) and ranks that cut differently would
deadlock; one shared profile makes every rank reach the same sizes, and a cut that cannot be made
(more stages than layers, a memory cap nothing meets) raises the same ``ValueError`` on every rank
instead of leaving the others waiting. Data-parallel replicas then take replica 0's profile, so the
same stage holds the same layers in every replica (their gradients are averaged stage by stage).

The measurement runs in the ``Pipeline`` constructor, not at the first step, because the caller
builds its optimizer from ``pipe.parameters()`` before stepping: pass ``sample_input=`` (one
micro-batch of inputs, e.g. the first step's). It runs where the layers are (move the model to the
device first to profile on it), with the random-number state restored afterwards, so dropout in the
profiled forwards does not shift the training run's randomness.

The first candidate follows the schedule's placement: a V (rank r holds stages r and 2p-1-r) cuts
with ``"v"``, which balances each rank's two chunks together; any other placement (one stage per rank,
or interleaved loops) with ``"dp"``, the optimal min-max over stages. The min-max cuts and the even
one are then simulated with the schedule itself under the profiled costs, and the fastest is kept
(``best_cut``): balance is a proxy, the simulated step is the goal.

When the schedule was named (``schedule="zb"``) rather than given, each candidate cut also gets the
schedule its generator makes for that cut's profiled per-stage costs, the way the zero-bubble paper
profiles and then schedules: the unit-cost order assumes F = I = W on every stage, and measured
ratios move the best order (V-Half at 4 ranks with I = 2F: 25% shorter step; ``best_plan``). The
plan keeps whichever of the two schedules the simulator predicts faster, so profiling never loses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate, pairwise

import torch
import torch.distributed as dist
from torch import nn

from bubbleless_partition import LayerCost, Partition, Profile, cut, price_pipeline, profile
from bubbleless_schedules import Costs, Schedule, simulate, v_placement

from .collectives import backend_device
from .comm import wait_collective
from .stages import stage_sizes

# LayerCost fields, in the order they travel in the broadcast tensor
_FIELDS = ("forward", "input_grad", "weight_grad", "recompute", "param_bytes", "activation_bytes_per_token",
           "output_bytes_per_token")
_OK, _FAILED = 1.0, 0.0


def method_for(schedule: Schedule) -> str:
    """``"v"`` for V placement (balance each rank's two chunks), ``"dp"`` for everything else."""
    p = schedule.num_ranks
    if schedule.num_stages == 2 * p and tuple(schedule.stage_to_rank) == v_placement(p):
        return "v"
    return "dp"


def stage_costs(prof: Profile, sizes) -> Costs:
    """Per-stage F, I, W (ms per micro-batch) of ``sizes`` over ``prof``: what the simulator takes."""
    bounds = (0, *accumulate(sizes))

    def per_stage(name: str) -> tuple[float, ...]:
        return tuple(sum(getattr(layer, name) for layer in prof.layers[a:b]) for a, b in pairwise(bounds))

    return Costs(per_stage("forward"), per_stage("input_grad"), per_stage("weight_grad"),
                 extra={"units": "ms", "source": prof.source})


def predicted_effect(schedule: Schedule, prof: Profile, sizes, baseline: Schedule | None = None) -> str:
    """Report lines: the simulator's step time and bubble rate under the profile, the even cut against
    ``sizes``; the even cut runs ``baseline`` (the schedule before profiling) when given, else ``schedule``."""
    lines = ["partition     auto (the fastest simulated of the min-max and uniform cuts), with the layer "
             "profile (per-stage F/I/W, no communication cost)"]
    even = stage_sizes(prof.num_layers, schedule.num_stages)
    for label, cut_sizes, plan_schedule in (("even", even, baseline or schedule), ("auto", list(sizes), schedule)):
        timeline = simulate(plan_schedule, stage_costs(prof, cut_sizes))
        lines.append(f"  {label} cut    {cut_sizes}: predicted step {timeline.makespan:.3f} ms, "
                     f"bubble {timeline.bubble_rate:.1%}")
    if baseline is not None and baseline.actions != schedule.actions:
        lines.append(f"  the auto cut runs {schedule.name or 'the schedule'} generated for its profiled costs")
    return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """A cut and the schedule to run on it."""

    partition: Partition
    schedule: Schedule
    makespan: float  # the simulator's step under the profiled costs, ms


def best_plan(prof: Profile, schedule: Schedule, memory_cap=None,
              generate_for: Callable[[Costs], Schedule] | None = None) -> Plan:
    """The cut, and with ``generate_for`` the schedule, whose step the simulator predicts shortest.

    The placement's own method (``method_for``) balances what it can see (stage or rank totals), but a
    schedule's step also depends on where in its order each stage's work falls: with ZB-V on a small
    model, the rank-balanced "v" cut was predicted 12% slower than the even one. So the min-max cuts
    and the even one are each simulated under the profiled per-stage costs and the fastest is kept
    (first listed on a tie). Under a ``memory_cap`` only the placement's method is used, since the cap
    means bytes per rank for a V and per stage otherwise.

    ``generate_for(costs)`` makes the schedule for a cut's costs (same generator, same placement); each
    cut then runs the faster of that and ``schedule``.
    """
    primary = method_for(schedule)
    methods = (primary,) if memory_cap is not None else tuple(dict.fromkeys((primary, "dp", "uniform")))
    best: Plan | None = None
    for method in methods:
        try:
            part = cut(prof, num_stages=schedule.num_stages, method=method, memory_cap=memory_cap)
        except ValueError:
            if method == primary:
                raise
            continue
        costs = stage_costs(prof, part.sizes)
        candidates = [schedule] if generate_for is None else [generate_for(costs), schedule]
        for candidate in candidates:
            makespan = simulate(candidate, costs).makespan
            if best is None or makespan < best.makespan - 1e-12:
                best = Plan(part, candidate, makespan)
    return best


def best_cut(prof: Profile, schedule: Schedule, memory_cap=None) -> Partition:
    """The cut whose step the simulator predicts shortest for this very schedule (``best_plan``)."""
    return best_plan(prof, schedule, memory_cap).partition


def auto_cut(layers, schedule: Schedule, sample_input, *, memory_cap=None, rank: int, num_ranks: int, group=None,
             data_parallel_group=None, timeout: float, repeats: int = 5,
             generate_for: Callable[[Costs], Schedule] | None = None) -> tuple[Partition, Profile, Schedule]:
    """Measure (rank 0), share, cut (and regenerate, see ``best_plan``); returns the same (Partition,
    Profile, Schedule) on every rank."""
    if sample_input is None:
        raise ValueError(
            "partition='auto' measures the layers on one micro-batch before the first step: pass "
            "sample_input= (one micro-batch of inputs, e.g. inputs.chunk(num_microbatches)[0])"
        )
    if len(layers) < schedule.num_stages:
        raise ValueError(
            f"the model has {len(layers)} layers but the schedule has {schedule.num_stages} stages; "
            f"give a model with at least {schedule.num_stages} layers or a schedule with fewer stages"
        )
    if memory_cap is not None and (isinstance(memory_cap, bool) or not isinstance(memory_cap, (int, float))
                                   or not memory_cap > 0):
        raise ValueError(f"memory_cap is bytes per stage (per rank for V schedules) and must be positive, "
                         f"got {memory_cap!r}")
    measured, error = None, None
    if rank == 0:
        try:
            measured = measure(layers, sample_input, repeats=repeats)
        except Exception as exc:  # shared as a failure flag first, so the other ranks raise too
            error = exc
    prof, ok = _share(measured, len(layers), rank=rank, num_ranks=num_ranks, group=group,
                      data_parallel_group=data_parallel_group, timeout=timeout)
    if error is not None:
        raise error
    if not ok:
        raise ValueError("partition='auto': rank 0 of the pipeline failed to profile the layers; see its error")
    plan = best_plan(prof, schedule, memory_cap, generate_for)
    part = plan.partition
    # price the cut with the schedule's own placement (``dp`` prices each stage as if on its own rank)
    priced = price_pipeline(prof, part.sizes, method=part.method, stage_to_rank=schedule.stage_to_rank)
    return priced, prof, plan.schedule


def measure(layers, sample_input, *, repeats: int = 5, device=None) -> Profile:
    """``bubbleless_partition.profile`` of the layers where they are, the RNG state left as it was.

    Layers that pass tuples (the MoE router statistics, the test model's side tensors) are shown to the
    profiler as tensor -> tensor through ``_MainTensor``: their first floating-point tensor is timed as the
    activation and the rest ride along unchanged. ``device``: where to time them (default: where the
    layers' parameters are; the profiler moves each layer there).
    """
    device = _device_of(layers) if device is None else torch.device(device)
    first, adapters = main_tensor_chain(layers, sample_input, device)
    names = [f"{i}:{type(layer).__name__}" for i, layer in enumerate(layers)]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the profiler's grads go through autograd.grad, not .grad
        measured = profile(adapters, first, repeats=repeats, warmup=1, device=device, names=names,
                           name="pipeline layers")
    tokens = measured.tokens_per_microbatch
    return measured.with_(layers=tuple(
        replace(cost, output_bytes_per_token=cost.output_bytes_per_token + riding_bytes(adapter) / tokens)
        for cost, adapter in zip(measured.layers, adapters, strict=True)))


def riding_bytes(adapter: _MainTensor) -> int:
    """Bytes of the tensors riding beside a profiled layer's main output (the MoE router statistics, rotary
    embeddings, the test model's side tensors), from its last forward: the profiler counts the main tensor
    alone as the output, but a stage boundary sends (and the pool uploads) the whole output."""
    whole = adapter.output.rebuild(torch.empty(0))
    tensors = () if isinstance(whole, torch.Tensor) else tuple(t for t in whole if isinstance(t, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors)


def main_tensor_chain(layers, sample_input, device) -> tuple[torch.Tensor, list[nn.Module]]:
    """(the first layer's main tensor on ``device``, the layers as tensor -> tensor modules, ``_MainTensor``):
    each adapter rebuilds its layer's whole input from the main tensor the one before it returned."""
    first, rebuild = _main_tensor(_to(sample_input, device))
    adapters, carry = [], _Carry(rebuild)
    for layer in layers:
        adapter = _MainTensor(layer, carry)
        adapters.append(adapter)
        carry = adapter.output
    return first, adapters


class _Carry:
    """How to rebuild a layer's whole activation from its main tensor (set by the layer before it)."""

    def __init__(self, rebuild) -> None:
        self.rebuild = rebuild


class _MainTensor(nn.Module):
    def __init__(self, layer: nn.Module, source: _Carry) -> None:
        super().__init__()
        self.layer = layer
        self.source = source
        self.output = _Carry(lambda tensor: tensor)

    def forward(self, main: torch.Tensor) -> torch.Tensor:
        out = self.layer(self.source.rebuild(main))
        main_out, self.output.rebuild = _main_tensor(out)
        return main_out


def _main_tensor(activation):
    """(the tensor the profiler times, a function that puts a tensor back in its place in the activation)."""
    if isinstance(activation, torch.Tensor):
        return activation, lambda tensor: tensor
    parts = tuple(activation)
    index = next((i for i, t in enumerate(parts) if isinstance(t, torch.Tensor) and t.is_floating_point()), 0)
    if not isinstance(parts[index], torch.Tensor):
        raise ValueError(f"partition='auto' needs layers that pass Tensors or tuples of Tensors, got {activation!r}")
    side = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in parts)
    return parts[index], lambda tensor: side[:index] + (tensor,) + side[index + 1:]


def _to(activation, device):
    if isinstance(activation, torch.Tensor):
        return activation.to(device)
    return tuple(t.to(device) for t in activation)


def _device_of(layers) -> torch.device:
    for layer in layers:
        for p in layer.parameters():
            return p.device
    return torch.device("cpu")


def _share(measured: Profile | None, num_layers: int, *, rank, num_ranks, group, data_parallel_group,
           timeout) -> tuple[Profile, bool]:
    """Rank 0's profile on every rank of the pipeline, then replica 0's on every replica."""
    buffer = _encode(measured, num_layers).to(backend_device(group))
    if num_ranks > 1:
        _broadcast(buffer, group, timeout, rank, "sharing rank 0's layer profile")
    ok = buffer[0].item() == _OK
    if data_parallel_group is not None:
        _broadcast(buffer, data_parallel_group, timeout, rank, "sharing replica 0's layer profile")
        ok = ok and buffer[0].item() == _OK
    return (_decode(buffer.cpu()) if ok else None), ok


def _broadcast(buffer: torch.Tensor, group, timeout: float, rank: int, what: str) -> None:
    source = 0 if group is None else dist.get_global_rank(group, 0)
    work = dist.broadcast(buffer, src=source, group=group, async_op=True)
    wait_collective(work, timeout, what, rank)


def _encode(measured: Profile | None, num_layers: int) -> torch.Tensor:
    """[status, tokens per micro-batch, then each layer's ``_FIELDS``] as float64 (exact for these sizes)."""
    buffer = torch.zeros(2 + num_layers * len(_FIELDS), dtype=torch.float64)
    if measured is None:
        buffer[0] = _FAILED
        return buffer
    buffer[0], buffer[1] = _OK, measured.tokens_per_microbatch
    values = [float(getattr(layer, name)) for layer in measured.layers for name in _FIELDS]
    buffer[2:] = torch.tensor(values, dtype=torch.float64)
    return buffer


def _decode(buffer: torch.Tensor) -> Profile:
    rows = buffer[2:].view(-1, len(_FIELDS)).tolist()
    layers = tuple(LayerCost(name=str(i), **dict(zip(_FIELDS, row, strict=True))) for i, row in enumerate(rows))
    return Profile(layers=layers, tokens_per_microbatch=int(buffer[1].item()), name="pipeline layers",
                   source="measured on pipeline rank 0")
