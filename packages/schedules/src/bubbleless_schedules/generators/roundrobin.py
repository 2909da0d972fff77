"""``roundrobin``: RoundPipe's dispatch of stage jobs to a pool of stateless devices.

The model's layers are cut into forward groups, one fused last group (forward, loss and backward)
and backward groups (see ``roundrobin_layout`` for the stage numbering, the dependency rule, costs
and memory). Jobs run in order: every forward group, the last group, then the backward groups from
the top layers down; job k goes to device k mod p. A job is LOAD (weights), its actions for every
micro-batch in order, and STORE (gradients) for jobs that compute them; forward jobs keep no graph,
backward jobs recompute (R) then backpropagate (B) one micro-batch at a time.

Options (all optional):

- ``num_layers``: layers in the model (default ``4 * num_ranks``, or what the group lists add up to).
- ``last_layers``: layers in the fused last group (default: one backward group's size).
- ``forward_stages``: the forward groups, as a list of layer counts (first layers first) or a number of
  groups of near-equal size. Default: groups about ``(R + I + W) / F`` times a backward group's size (3
  at unit costs), so a forward job costs about what a backward job does (asymmetric splitting).
- ``backward_stages``: the backward groups, likewise. Default: groups of ``max(1, round(L / (4 p)))``
  layers, so each device gets a few jobs; under ``memory_limit``, small enough that a device's peak
  (one micro-batch of its largest group, ``n * p / L`` M_B) fits.
- ``weight_transfers``: insert LOAD/STORE (default True; ``lowering.add_weight_transfers`` places them).
- ``layer_costs``: a ``Costs`` whose fields are sequences with one value per layer, in model order with
  the LM head last (``recompute`` defaults to ``forward``, scalars apply to every layer). The generator
  then chooses the cut and the dispatch itself, judged by the simulator (``roundrobin_search``): jobs go
  to the device that frees first, recompute may run ahead of the gradient into the waits (also into a
  paced forward job's waits, for the device's next backward job), the cut may taper at both ends to
  shorten the wavefront's fill and drain, or be *fine* (one body layer per backward group, the fused group
  split over devices so it does not pace them: ``roundrobin_cut.candidate_cuts``), and a local search moves layers between groups while the
  makespan shrinks (``roundrobin_refine``); the job that paces the step (the fused last group, or the
  heaviest job) may run on two or more devices, its micro-batches dealt among them (one more upload of
  its weights per device), and the fused group may grow (less recompute) when split so, within
  ``weight_limit`` (and ``memory_limit``: one micro-batch of it is held from its F to its B); the
  backward jobs that run last (the drain) and the forward jobs that run first (the fill) may be dealt over
  more devices too, and the cut refined again under that job split.
  ``costs`` is then not used; the
  cut options above, when given, pin the cut. Simulate the result with
  ``roundrobin_cut.job_costs(layer_costs, pool_groups(schedule))``.
- ``recompute_ahead``: with ``layer_costs``, how many micro-batches a device may recompute before their
  backward (1 is RoundPipe's one-at-a-time; default: the faster of 1 and 2 within ``memory_limit``).
- ``weight_limit``: with ``layer_costs``, the most layers of weights a device may hold at once (two
  consecutive jobs, ``roundrobin_layout.peak_weight_layers``). Default: what the best plan with the
  candidate cuts holds, so a larger fused group split over devices (less recompute, one upload of it
  per device) is tried only within it; ``weight_limit=num_layers`` lets it grow as the simulator likes.
- ``split_backward``: with ``layer_costs``, run each gradient job's B as I then W, W deferred into the
  device's waits (zero-bubble's idea inside the pool). Default: whichever of I/W and B the simulator
  runs faster for the chosen plan (``roundrobin_search``; B on a tie); True forces I/W, False keeps B.
  The pool executor runs both (``bubbleless_runtime.pool_split``).
- ``objective``: with ``layer_costs``, what the simulator judges the search's finalists by
  (``roundrobin_judge.OBJECTIVES``): ``"makespan"`` (default) one iteration, as ``RoundRobinPipeline.step``
  runs it; ``"period"`` the steady-state period of back-to-back iterations as ``RoundRobinPipeline.steps``
  overlaps them (``simulate_steady.pool_steady_state``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..action import Action, Kind
from ..costs import Costs
from ..lowering import add_weight_transfers
from ..registry import register
from ..roundrobin_layout import PoolGroups
from ..schedule import Schedule
from .roundrobin_cut import check_layer_costs
from .roundrobin_judge import objective_judge
from .roundrobin_search import search


@register("roundrobin")
def roundrobin(
    *,
    num_ranks: int,
    num_microbatches: int,
    costs: Costs,
    memory_limit: float | None = None,
    num_layers: int | None = None,
    last_layers: int | None = None,
    forward_stages: int | Sequence[int] | None = None,
    backward_stages: int | Sequence[int] | None = None,
    weight_transfers: bool = True,
    layer_costs: Costs | None = None,
    recompute_ahead: int | None = None,
    split_backward: bool | None = None,
    weight_limit: int | None = None,
    objective: str | None = None,
) -> Schedule:
    """Stage jobs over all micro-batches, dealt round-robin to ``num_ranks`` pool devices."""
    if layer_costs is not None:
        return _from_layer_costs(
            layer_costs, num_ranks=num_ranks, num_microbatches=num_microbatches, memory_limit=memory_limit,
            num_layers=num_layers, last_layers=last_layers, forward_stages=forward_stages,
            backward_stages=backward_stages, weight_transfers=weight_transfers, recompute_ahead=recompute_ahead,
            split_backward=split_backward, weight_limit=weight_limit, objective=objective,
        )
    for name, value in (("recompute_ahead", recompute_ahead), ("split_backward", split_backward or None),
                        ("weight_limit", weight_limit), ("objective", objective)):
        if value is not None:
            raise ValueError(f"roundrobin option {name} needs layer_costs= (per-layer costs to dispatch by)")
    groups = pool_cut(
        num_ranks=num_ranks, costs=costs, memory_limit=memory_limit, num_layers=num_layers,
        last_layers=last_layers, forward_stages=forward_stages, backward_stages=backward_stages,
    )
    schedule = dispatch(groups, num_ranks, num_microbatches)
    return add_weight_transfers(schedule) if weight_transfers else schedule


def _from_layer_costs(layer_costs, *, num_ranks, num_microbatches, memory_limit, num_layers, last_layers,
                      forward_stages, backward_stages, weight_transfers, recompute_ahead, split_backward,
                      weight_limit, objective) -> Schedule:
    count = check_layer_costs(layer_costs)
    if num_layers is not None and num_layers != count:
        raise ValueError(f"roundrobin: num_layers={num_layers} but layer_costs give {count} layers; drop num_layers "
                         f"or give one cost per layer")
    if recompute_ahead is not None:
        _check_count("recompute_ahead", recompute_ahead, 1)
    if weight_limit is not None:
        _check_count("weight_limit", weight_limit, 1)
    objective = "makespan" if objective is None else objective
    objective_judge(objective)  # refuse an unknown one before the search
    pinned = None
    if any(x is not None for x in (last_layers, forward_stages, backward_stages)):
        pinned = pool_cut(num_ranks=num_ranks, costs=Costs.unit(), memory_limit=None, num_layers=count,
                          last_layers=last_layers, forward_stages=forward_stages, backward_stages=backward_stages)
    return search(layer_costs, num_devices=num_ranks, num_microbatches=num_microbatches, memory_limit=memory_limit,
                  pinned=pinned, ahead=recompute_ahead, weight_transfers=weight_transfers,
                  split_backward=None if split_backward is None else bool(split_backward), weight_limit=weight_limit,
                  objective=objective)


_JOB_ACTIONS = {"forward": (Kind.F,), "last": (Kind.F, Kind.B), "backward": (Kind.R, Kind.B)}


def dispatch(groups: PoolGroups, num_devices: int, num_microbatches: int) -> Schedule:
    """Job k (in execution order) to device k mod ``num_devices``; each job's micro-batches in order."""
    rows: list[list[Action]] = [[] for _ in range(num_devices)]
    for job in range(groups.num_stages):
        kinds = _JOB_ACTIONS[groups.role(job)]
        rows[job % num_devices] += [Action(job, kind, m) for m in range(num_microbatches) for kind in kinds]
    return Schedule(
        rows, num_stages=groups.num_stages, num_microbatches=num_microbatches, stage_to_rank=None,
        name="roundrobin", layout="roundrobin", meta=groups.meta(),
    )


def pool_cut(
    *,
    num_ranks: int,
    costs: Costs,
    memory_limit: float | None = None,
    num_layers: int | None = None,
    last_layers: int | None = None,
    forward_stages: int | Sequence[int] | None = None,
    backward_stages: int | Sequence[int] | None = None,
) -> PoolGroups:
    """The forward/last/backward cut from the options (see the module docstring for the defaults)."""
    given = [sum(x) for x in (forward_stages, backward_stages) if _is_list(x)]
    if num_layers is None:
        num_layers = given[0] + (last_layers or 1) if given else 4 * num_ranks
    _check_count("num_layers", num_layers, 1)
    backward_size = max(1, round(num_layers / (4 * num_ranks)))
    if memory_limit is not None:  # a device holds one micro-batch of a group: n * p / L M_B
        fits = math.floor(memory_limit * num_layers / num_ranks + 1e-9)
        if fits < 1:
            raise ValueError(
                f"memory_limit={memory_limit:g} M_B is below one layer's activations on a pool device "
                f"({num_ranks / num_layers:g} M_B with num_layers={num_layers} and {num_ranks} devices); "
                f"raise the limit or give more layers"
            )
        backward_size = min(backward_size, fits)
    if last_layers is None:
        last_layers = num_layers - given[0] if given else min(backward_size, num_layers)
    _check_count("last_layers", last_layers, 1)
    body = num_layers - last_layers
    if body < 0:
        raise ValueError(f"last_layers={last_layers} is more than num_layers={num_layers}")
    ratio = _backward_to_forward_ratio(costs)
    forward = _groups("forward_stages", forward_stages, body, max(1, round(ratio * backward_size)))
    backward = _groups("backward_stages", backward_stages, body, backward_size)
    return PoolGroups(forward, last_layers, backward)


def _is_list(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"roundrobin option {name} must be an integer >= {minimum}, got {value!r}")


def _groups(name: str, option, body: int, default_size: int) -> tuple[int, ...]:
    """Layer counts covering ``body`` layers: a given list, a number of near-equal groups, or the default size."""
    if _is_list(option):
        counts = tuple(option)
        for count in counts:
            _check_count(f"{name} entry", count, 1)
        if sum(counts) != body:
            raise ValueError(
                f"roundrobin option {name}={list(counts)} covers {sum(counts)} layers; it must cover the "
                f"{body} layers before the last group (num_layers minus last_layers)"
            )
        return counts
    if body == 0:
        if option not in (None, 0):
            raise ValueError(f"roundrobin option {name}={option!r}: no layers are left before the last group")
        return ()
    if option is None:
        option = math.ceil(body / default_size)
    _check_count(name, option, 1)
    if option > body:
        raise ValueError(f"roundrobin option {name}={option} asks for more groups than the {body} layers to cut")
    small, extra = divmod(body, option)
    return tuple(small + 1 if g < extra else small for g in range(option))


def _backward_to_forward_ratio(costs: Costs) -> float:
    """(R + I + W) / F per layer from scalar costs (3 at unit costs); 3 when costs are per stage or F is 0."""
    values = [costs.forward, costs.backward_input, costs.backward_weight,
              costs.forward if costs.recompute is None else costs.recompute]
    if any(isinstance(v, tuple) for v in values) or not values[0]:
        return 3.0
    forward, backward_input, backward_weight, recompute = (float(v) for v in values)
    return (recompute + backward_input + backward_weight) / forward
