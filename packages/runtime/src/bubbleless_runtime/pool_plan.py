"""What the device pool runs: the round-robin schedule, its group cut, and whether it fits the budget.

``partition`` of ``RoundRobinPipeline``:

- ``None`` or ``"even"``: the ``roundrobin`` generator's default groups for the model's layer count;
- a ``PoolGroups`` (forward groups, the fused last group, backward groups, in layer counts);
- a ``bubbleless_partition.Partition`` made by ``cut(method="roundrobin")``, whose two groupings both
  end with the fused group (``groups_from_partition`` is the one place that converts);
- a ``bubbleless_partition.Profile`` (measured elsewhere, or analytic): cut here, as for ``"auto"``, with
  LOAD/STORE priced at the copy bandwidth measured with it (``COPY_BANDWIDTH``: ``profile_layers`` records
  it, so ``pipe.profile`` passed back plans on the same figures), measured again where it has none;
- ``"auto"``: profile the layers on ``sample_input`` and cut. Every count of backward groups from 1 to
  ``3 x devices`` is cut (min-max job times, ``bubbleless_partition``), dispatched, and simulated under
  the profiled per-job costs; the fastest plan is kept (balance is a proxy, the simulated step the goal).
  The ``roundrobin`` generator given the per-layer costs (``layer_costs=``: it picks a cut and a
  dispatch of its own, tapered groups, recompute ahead into waits, jobs split over devices) is one
  more candidate, kept when the simulator says it is faster. Under a memory cap every candidate is held
  to the bytes a device may hold (``pool_plan_cap``); the generator's plans tried are its own and, for
  its own dispatch and each leaner one, that of the largest ``weight_limit`` that fits.
  ``objective`` among the options (``roundrobin_judge.OBJECTIVES``) is what "fastest" means:
  ``"makespan"`` (the default) one step's, ``"period"`` the steady-state period of the overlapped steps
  ``RoundRobinPipeline.steps`` runs under the asynchronous optimizer (``simulate_steady.pool_steady_state``),
  which ``RoundRobinPipeline`` asks for by default with ``optimizer={..., "asynchronous": True}``. It
  judges every candidate (``plan_judge``: on a GPU pool the period with the uploads on the copy stream, as
  the executor runs them there) and is passed to the layer-cost generator, never to a DP cut's plain dispatch.
  Under ``"period"`` the generator's makespan plans are candidates too, so the plan is never slower by the
  period than the one ``"makespan"`` would pick from the generator: the generator's own period search
  judges its finalists over as many steps as this planner but without the copy stream (it knows no GPU).
  When it judged over 4 steps, on 4 RTX 4090s (Qwen3-1.7B, 32 micro-batches, bench/modelled) it returned
  (27,) / 3 / (9, 9, 9), a period of 2389.4 ms over 12 steps with uploads streamed, where its makespan plan
  (6, 5) / 19 / (3, 2, 5, 1) settles at 2282.5.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from bubbleless_partition import LayerCost, Partition, Profile, cut
from bubbleless_schedules import Costs, Schedule, generate, validate
from bubbleless_schedules.generators.roundrobin_judge import PERIOD_ITERATIONS, objective_judge, period_judge
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups

from .arguments import check_microbatches
from .auto_partition import measure
from .pool_kept import with_kept_until_w
from .pool_plan_cap import (
    AskedOnce,
    fits,
    generated_within,
    generator_asked,
    leanest_generated,
    plan_peak_bytes,
)
from .pool_plan_refusal import no_plan_fits
from .pool_precision import PRECISIONS, bounded_over_precisions


def groups_from_partition(partition: Partition) -> PoolGroups:
    """``PoolGroups`` of a round-robin ``Partition``: partition counts the fused last group at the end
    of both groupings, the schedule keeps it apart."""
    if partition.backward is None:
        raise ValueError(
            f"partition {list(partition.sizes)} was cut with method {partition.method!r}; the device pool needs "
            "a round-robin cut (bubbleless_partition.cut(..., method='roundrobin')) or a PoolGroups"
        )
    forward, backward = partition.sizes, partition.backward.sizes
    return PoolGroups(tuple(forward[:-1]), forward[-1], tuple(backward[:-1]))


def generate_pool(name: str, groups: PoolGroups | None, *, num_layers: int, num_devices: int, num_microbatches: int,
                  costs: Costs | None, options: dict) -> Schedule:
    cut_options = {"num_layers": num_layers}
    if groups is not None:
        cut_options.update(forward_stages=list(groups.forward), last_layers=groups.last,
                           backward_stages=list(groups.backward))
    overlap = sorted(set(cut_options) & set(options) - {"num_layers"})
    if groups is not None and overlap:
        raise ValueError(f"schedule_options {overlap} conflict with the partition's cut; give one or the other")
    if "objective" in options and "layer_costs" not in options:
        raise ValueError(f"schedule_options objective={options['objective']!r} ranks the plans partition='auto' "
                         "(or a bubbleless_partition Profile) searches; this partition is a fixed cut with one "
                         "dispatch, so there is nothing to rank: drop the objective or pass partition='auto'")
    return generate(name, num_ranks=num_devices, num_microbatches=num_microbatches, costs=costs,
                    **{**options, **cut_options})


def job_costs(profile: Profile, groups: PoolGroups, *, bandwidth: float | None) -> Costs:
    """Per-job simulator costs (ms) from a per-layer profile; LOAD/STORE move weight/gradient bytes at
    ``bandwidth`` GB/s (None: free)."""
    def total(layers, pick) -> float:
        return sum(pick(profile.layers[i]) for i in layers)

    forward, recompute, back_in, back_w, load, store = [], [], [], [], [], []
    for job in range(groups.num_stages):
        layers = groups.layers(job)
        role = groups.role(job)
        forward.append(total(layers, lambda c: c.forward))
        recompute.append(total(layers, lambda c: c.recompute))
        back_in.append(total(layers, lambda c: c.input_grad) if role != "forward" else 0.0)
        back_w.append(total(layers, lambda c: c.weight_grad) if role != "forward" else 0.0)
        moved = total(layers, lambda c: c.param_bytes)
        seconds = 0.0 if bandwidth is None else moved / (bandwidth * 1e6)
        load.append(seconds)
        store.append(seconds if role != "forward" else 0.0)
    return Costs(tuple(forward), tuple(back_in), tuple(back_w), 0.0, recompute=tuple(recompute),
                 load=tuple(load), store=tuple(store))


COPY_BANDWIDTH = "copy_bandwidth_gb_s"
"""``Profile.extra`` key: the host -> device copy bandwidth (GB/s) ``profile_layers`` measured with the timings,
what the plan prices LOAD/STORE with (``copy_bandwidth_of``)."""


def copy_bandwidth_of(profile: Profile, device: torch.device) -> float:
    """The copy bandwidth (GB/s) a plan on ``profile`` prices LOAD/STORE with: the one measured with its
    timings (``extra[COPY_BANDWIDTH]``, ``profile_layers``), so that a profile passed back as ``partition=``
    plans on the same figures as the build that measured it (``pool_plan_refusal.SAME_TIMINGS``); measured
    on ``device`` now for a profile without it (analytic, or measured elsewhere)."""
    recorded = profile.extra.get(COPY_BANDWIDTH)
    return copy_bandwidth(device) if recorded is None else float(recorded)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 24) -> float:
    """GB/s of one host -> device copy of ``nbytes`` (a real copy, also for a CPU device)."""
    source = torch.empty(nbytes, dtype=torch.uint8)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target.copy_(source)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(3):
        target.copy_(source)
    sync()
    return 3 * nbytes / max(time.perf_counter() - start, 1e-9) / 1e9


def layer_costs_of(profile: Profile, *, bandwidth: float | None) -> Costs:
    """Per-layer costs (model order, the LM head last) for ``generate("roundrobin", layer_costs=...)``;
    LOAD/STORE move each layer's weight bytes at ``bandwidth`` GB/s (None: free), as ``job_costs``."""
    layers = profile.layers
    moved = [0.0 if bandwidth is None else c.param_bytes / (bandwidth * 1e6) for c in layers]
    return Costs(tuple(c.forward for c in layers), tuple(c.input_grad for c in layers),
                 tuple(c.weight_grad for c in layers), 0.0,
                 recompute=tuple(c.forward if c.recompute is None else c.recompute for c in layers),
                 load=tuple(moved), store=tuple(moved))


_CUT_OPTIONS = frozenset({"forward_stages", "backward_stages", "last_layers", "layer_costs", "num_layers"})
_LAYER_COST_OPTIONS = frozenset({"recompute_ahead", "split_backward", "weight_limit"})
"""``roundrobin`` options of its layer-cost dispatch only (the plain dispatch refuses them): when the caller
pins one, each DP cut is dispatched by the layer-cost generator with the cut pinned, so every candidate
honours it (``dp_cut_options``)."""


def dp_cut_options(name: str, options: dict, profile: Profile, *, bandwidth: float | None,
                   objective: str = "makespan") -> dict:
    """The options each DP cut's schedule is generated with: ``options`` as given (without ``objective``),
    and for ``roundrobin`` with a layer-cost-only option pinned (``_LAYER_COST_OPTIONS``, e.g.
    ``split_backward=True``) the per-layer costs and ``objective`` as well, so the generator dispatches the
    pinned cut under the option rather than the plain dispatch dropping it (a pinned option is never
    dropped: the fastest plan that honours it wins)."""
    if name != "roundrobin" or not _LAYER_COST_OPTIONS & set(options):
        return options
    return {**options, "layer_costs": layer_costs_of(profile, bandwidth=bandwidth), "objective": objective}


def objective_of(options: dict) -> tuple[str, dict]:
    """(``objective``, the other options) of a plan's options (an unknown objective is refused by
    ``plan_judge``, before any plan is searched)."""
    return options.get("objective", "makespan"), {k: v for k, v in options.items() if k != "objective"}


JUDGED_ITERATIONS = PERIOD_ITERATIONS
"""Steps ``plan_judge`` runs back to back for a period: as many as the generator's own ``objective="period"``
judges its finalists over (``roundrobin_judge.PERIOD_ITERATIONS``, which says why 12)."""


def plan_judge(objective: str, *, load_stream: bool = False):
    """``judge(schedule, costs)``: the time ``auto_groups`` ranks a plan by for ``objective``: one step's
    makespan (``simulate``), or the steady period of ``JUDGED_ITERATIONS`` steps as ``steps`` overlaps them
    (``pool_steady_state``), with ``load_stream`` (a pool with a GPU) the uploads on the copy stream."""
    judge = objective_judge(objective)  # an unknown objective is refused here
    return period_judge(load_stream=load_stream) if objective == "period" else judge


def auto_groups(profile: Profile, *, num_devices: int, num_microbatches: int, name: str, options: dict,
                bandwidth: float | None, memory_cap: float | None, input_bytes: float = 0.0,
                load_stream: bool = False) -> tuple[PoolGroups, Schedule, Costs]:
    """The cut and schedule the simulator predicts fastest among 1 .. 3 x devices backward groups and,
    for ``roundrobin`` with no cut options, the generator's own cut and dispatch from the per-layer costs.
    Every candidate honours ``options``: a layer-cost-only one pinned (``split_backward=True``) has the DP
    cuts dispatched by the layer-cost generator too (``dp_cut_options``).
    ``memory_cap``: bytes per group (``cut()``'s rule); no device of the returned plan holds more than
    ``2 x memory_cap`` (``pool_plan_cap.plan_peak_bytes``: two jobs' weights and the activations held,
    ``input_bytes`` of the caller's micro-batch at layer 0). When none does, the ValueError gives the
    leanest ``memory_budget`` (= 2 x cap) at which this search finds a plan (``pool_plan_refusal``).
    ``options["objective"]``: what the candidates are ranked by (the module docstring); ``load_stream``:
    the pool has a GPU, its uploads on a copy stream (``plan_judge``)."""
    objective, options = objective_of(options)
    search = dict(num_devices=num_devices, num_microbatches=num_microbatches, name=name, options=options,
                  bandwidth=bandwidth, input_bytes=input_bytes,
                  asked=_Asked.of(profile, name, options, num_devices, num_microbatches, bandwidth, objective,
                                  load_stream))
    device_budget = None if memory_cap is None else 2 * memory_cap
    found = _fastest_within(profile, device_budget, **search)
    if found.best is not None:
        return found.best[1], found.best[2], found.best[3]
    raise no_plan_fits(
        profile, num_devices=num_devices, device_budget=device_budget, errors=found.errors,
        pinned={k: options[k] for k in sorted(_LAYER_COST_OPTIONS & set(options))} if found.pinned else {},
        candidates=_candidate_peaks(profile, found, **search),
        accepts=lambda budget: _fastest_within(profile, budget, **search).best is not None)


@dataclass(frozen=True)
class _Asked:
    """The generators of one ``auto_groups`` call, each question asked once (``pool_plan_cap.AskedOnce``):
    its refusal searches again under larger budgets and lists the leanest plans, asking much the same.
    ``dispatch(groups=...)``: a DP cut's schedule (``generate_pool`` under ``dp_cut_options``);
    ``generator``: the layer-cost generator's plans (``generator_asked``), searched for ``objective``;
    ``judge(schedule, costs)``: the time ``objective`` ranks a plan by (``plan_judge``); ``also``: under
    ``"period"``, the generator searched for one step's makespan, whose plans are candidates too (the
    module docstring), else None."""

    dispatch: AskedOnce
    generator: AskedOnce
    judge: object
    also: AskedOnce | None = None

    @property
    def generators(self) -> tuple[AskedOnce, ...]:
        return (self.generator,) if self.also is None else (self.generator, self.also)

    @staticmethod
    def of(profile: Profile, name: str, options: dict, num_devices: int, num_microbatches: int,
           bandwidth: float | None, objective: str = "makespan", load_stream: bool = False) -> _Asked:
        cut_options = dp_cut_options(name, options, profile, bandwidth=bandwidth, objective=objective)

        def dispatch(groups: PoolGroups) -> Schedule:
            return generate_pool(name, groups, num_layers=profile.num_layers, num_devices=num_devices,
                                 num_microbatches=num_microbatches, costs=job_costs(profile, groups, bandwidth=bandwidth),
                                 options=cut_options)

        layer_costs = layer_costs_of(profile, bandwidth=bandwidth)
        also = None if objective == "makespan" else generator_asked(layer_costs, num_devices, num_microbatches)
        return _Asked(AskedOnce(dispatch), generator_asked(layer_costs, num_devices, num_microbatches, objective),
                      plan_judge(objective, load_stream=load_stream), also)


@dataclass
class _Search:
    """What one search under a device budget found: the fastest plan that fits (its time by the objective,
    groups, schedule, costs) or None, each DP cut's plan over the budget (peak, group count), the counts
    ``cut()`` refused under the cap and its errors, and whether the DP cuts were dispatched with pinned options."""

    best: tuple | None = None
    over: list = field(default_factory=list)
    refused_counts: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    pinned: bool = False


def _fastest_within(profile: Profile, device_budget: float | None, *, num_devices: int, num_microbatches: int,
                    name: str, options: dict, bandwidth: float | None, input_bytes: float, asked: _Asked) -> _Search:
    cut_options = dp_cut_options(name, options, profile, bandwidth=bandwidth)
    found = _Search(pinned=cut_options is not options)
    memory_cap = None if device_budget is None else device_budget / 2

    def keep(schedule: Schedule) -> None:
        groups = pool_groups(schedule)  # the layer-cost generator may deal a job over devices
        costs = job_costs(profile, groups, bandwidth=bandwidth)
        figure = asked.judge(schedule, costs)
        if found.best is None or figure < found.best[0] - 1e-12:
            found.best = (figure, groups, schedule, costs)

    for count in range(1, min(profile.num_layers, 3 * num_devices) + 1):
        try:
            partition = cut(profile, num_stages=count, method="roundrobin", num_microbatches=num_microbatches,
                            memory_cap=memory_cap)
        except ValueError as error:
            found.errors.append(str(error))
            found.refused_counts.append(count)
            continue
        try:
            schedule = asked.dispatch(groups=groups_from_partition(partition))
        except ValueError as error:  # a pinned option no dispatch of this cut meets (weight_limit)
            if cut_options is options:
                raise
            found.errors.append(str(error))
            continue
        if not fits(schedule, profile, device_budget, input_bytes):  # a dispatch holding more than one micro-batch
            found.over.append((max(plan_peak_bytes(schedule, profile, input_bytes)), count))
            continue
        keep(schedule)
    if name == "roundrobin" and not _CUT_OPTIONS & set(options):
        layer_costs = layer_costs_of(profile, bandwidth=bandwidth)
        for generator in asked.generators:
            try:
                generated = generated_within(profile, device_budget, layer_costs=layer_costs,
                                             num_devices=num_devices, num_microbatches=num_microbatches,
                                             options=options, input_bytes=input_bytes, asked=generator)
            except ValueError:  # its own cuts miss a pinned option (weight_limit): a DP cut's plan may meet it
                if found.best is None:
                    raise
                generated = []
            for schedule in generated:
                keep(schedule)
    return found


def _candidate_peaks(profile: Profile, found: _Search, *, num_devices: int, num_microbatches: int, name: str,
                     options: dict, bandwidth: float | None, input_bytes: float,
                     asked: _Asked) -> list[tuple[float, str]]:
    """(peak bytes on the fullest device, what plan) of each plan a larger budget could let through: the
    DP cuts over the budget, those ``cut()`` refused under the cap cut without it, and for ``roundrobin``
    the generator's own and leanest plans (``leanest_generated``; under ``objective="period"`` its makespan
    plans' too, which ``auto_groups`` also weighs)."""
    candidates = [(peak, f"the cut into {count} backward groups") for peak, count in found.over]
    for count in found.refused_counts:
        try:
            partition = cut(profile, num_stages=count, method="roundrobin", num_microbatches=num_microbatches)
            schedule = asked.dispatch(groups=groups_from_partition(partition))
        except ValueError:
            continue
        candidates.append((max(plan_peak_bytes(schedule, profile, input_bytes)),
                           f"the cut into {count} backward groups"))
    if name == "roundrobin" and not _CUT_OPTIONS & set(options):
        layer_costs = layer_costs_of(profile, bandwidth=bandwidth)
        for generator in (asked.generator, asked.also):  # ``also``: the makespan plans a period search weighs
            if generator is not None:
                candidates += leanest_generated(profile, layer_costs=layer_costs, num_devices=num_devices,
                                                num_microbatches=num_microbatches, options=options,
                                                input_bytes=input_bytes, asked=generator)
    return candidates


def profile_layers(layers, sample_input, device: torch.device, precisions: tuple = PRECISIONS) -> Profile:
    """The layers timed on ``device`` (the pool's first) on one micro-batch, their bytes at the most any of
    ``precisions`` a step may run in keeps (``pool_precision``: the caller's autocast is known only at ``step``),
    and the host -> device copy bandwidth (``extra[COPY_BANDWIDTH]``). The model is in host memory and need
    not fit on the device: each layer is copied there in turn (``OneLayerOnDevice``)."""
    if sample_input is None:
        raise ValueError(
            "partition='auto' profiles the layers on one micro-batch: pass sample_input= (e.g. "
            "inputs.chunk(num_microbatches)[0]), or give partition= a Profile, a Partition or a PoolGroups"
        )
    slot: dict = {}
    on_device = [OneLayerOnDevice(layer, device, slot) for layer in layers]
    measured = measure(on_device, sample_input, device=device)
    bounded = bounded_over_precisions(measured, on_device, sample_input, device, precisions)
    kept = with_kept_until_w(bounded, on_device, sample_input, device, precisions)
    return kept.with_(extra={**kept.extra, COPY_BANDWIDTH: copy_bandwidth(device)})


class OneLayerOnDevice(nn.Module):
    """A host layer the profiler may "move" to a device: moving makes a device copy of it (dropping the
    copy the previous layer made in the same ``slot``), so the profiler's ``layer.to(device)`` never moves
    the caller's layer and one layer's weights at a time sit on the device."""

    def __init__(self, layer: nn.Module, device: torch.device, slot: dict) -> None:
        super().__init__()
        object.__setattr__(self, "host", layer)  # not a submodule: .to() must not reach it
        object.__setattr__(self, "slot", slot)
        self.device = device
        self.copy: nn.Module | None = None

    def _apply(self, fn, recurse=True):
        previous = self.slot.get("current")
        if previous is not None and previous is not self:
            previous.copy = None
        if self.copy is None:
            self.copy = copy.deepcopy(self.host).to(self.device)
        self.slot["current"] = self
        return self

    def forward(self, activation):
        return (self.host if self.copy is None else self.copy)(activation)


def check_schedule(schedule: Schedule, *, num_layers: int, num_devices: int, num_microbatches: int) -> Schedule:
    """ValueError unless ``schedule`` is a valid round-robin schedule for this model and pool."""
    if schedule.layout != "roundrobin":
        raise ValueError(
            f"{schedule.name or 'this schedule'!r} binds stages to ranks (layout {schedule.layout!r}); "
            "RoundRobinPipeline runs round-robin pool schedules (schedule='roundrobin'); use Pipeline for it"
        )
    groups = pool_groups(schedule)
    if groups.num_layers != num_layers:
        raise ValueError(
            f"schedule {schedule.name!r} cuts {groups.num_layers} layers but the model has {num_layers}; "
            f"generate it with num_layers={num_layers}"
        )
    if schedule.num_workers != num_devices:
        raise ValueError(
            f"schedule {schedule.name!r} is for {schedule.num_workers} devices but devices= lists {num_devices}"
        )
    check_microbatches(schedule, num_microbatches)
    validate(schedule)
    return schedule


__all__ = ["COPY_BANDWIDTH", "LayerCost", "OneLayerOnDevice", "auto_groups", "layer_costs_of", "check_schedule",
           "copy_bandwidth", "copy_bandwidth_of", "generate_pool", "groups_from_partition",
           "job_costs", "plan_judge", "plan_peak_bytes", "profile_layers"]
