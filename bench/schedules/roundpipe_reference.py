"""RoundPipe's dispatch and partitioner, written from the published description only.

Source: ``/work/shared/reference/schedule-algorithms.md`` ("RoundPipe's dispatch, as its own simulator
models it") and ``reference/roundpipe.md`` (partitioning). Nothing here imports our ``roundrobin``
generator or its cut; it uses the IR (``Action``, ``Schedule``), the group record ``PoolGroups`` and the
shared simulator, which judge ours too.

- **Rounds.** Micro-batches go in rounds of up to N (the pool's size). Within a round every stage runs
  as one job over the round's micro-batches, in execution order: forward groups, the fused last group
  (forward, loss, backward: no recompute), then the backward groups from the top layers down. Job k of
  a round goes to GPU (first + k) mod N, where ``first`` is the GPU that frees first when the round is
  dispatched (round 0: GPU 0).
- **Recompute aligned to the backward.** A backward job runs, per micro-batch in order, R (recompute
  from the saved forward input, which is ready long before) then B (which waits for the gradient from
  the job above): the R of micro-batch m fills the wait for m's gradient.
- **Comm** is charged only between different GPUs (the simulator's ``costs.comm``).
- **Partitioner.** Every stage-time cap from the slowest layer's job time to 1.1 times it (21 steps):
  the fused last group takes the LM head and as many layers below it as fit the cap (F + B each); the
  backward groups pack R + B per layer greedily up to the cap, the forward groups pack F up to the same
  cap (so forward groups hold about three times the layers). Keep the cut whose dispatch is fastest.

The dispatch is timed by its own recurrence (jobs in dispatch order, each device in order) and the
result is cross-checked against ``bubbleless_schedules.simulate`` by the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bubbleless_schedules import Action, Costs, Kind, Schedule
from bubbleless_schedules.roundrobin_layout import PoolGroups

CAP_STEPS = 21
"""Caps tried between the slowest layer's time and 1.1 times it."""


@dataclass(frozen=True)
class Dispatched:
    """A RoundPipe dispatch: the schedule, its per-job costs and the makespan its recurrence gives."""

    schedule: Schedule
    costs: Costs
    makespan: float
    groups: PoolGroups


def layer_value(layer_costs: Costs, name: str, layer: int) -> float:
    value = getattr(layer_costs, name)
    if name == "recompute" and value is None:
        value = layer_costs.forward
    return float(value[layer])


def job_costs(layer_costs: Costs, groups: PoolGroups) -> Costs:
    """Per-job (stage) costs: sums over each job's layers; a forward job has no backward."""
    fields = {"forward": [], "backward_input": [], "backward_weight": [], "recompute": []}
    for job in range(groups.num_stages):
        layers, role = groups.layers(job), groups.role(job)
        for name, values in fields.items():
            total = sum(layer_value(layer_costs, name, i) for i in layers)
            values.append(0.0 if role == "forward" and name.startswith("backward") else total)
    return Costs(tuple(fields["forward"]), tuple(fields["backward_input"]), tuple(fields["backward_weight"]),
                 layer_costs.comm, recompute=tuple(fields["recompute"]))


_KINDS = {"forward": (Kind.F,), "last": (Kind.F, Kind.B), "backward": (Kind.R, Kind.B)}


def _duration(costs: Costs, kind: Kind, job: int) -> float:
    if kind is Kind.F:
        return costs.forward[job]
    if kind is Kind.R:
        return costs.recompute[job]
    return costs.backward_input[job] + costs.backward_weight[job]


def _needs(groups: PoolGroups, action: Action) -> tuple[tuple, ...]:
    """The events an action waits for, from the published dependency rule (not from our layout)."""
    j, m = action.stage, action.microbatch
    role = groups.role(j)
    if action.kind is Kind.F:
        return (("F", j - 1, m),) if j > 0 else ()
    if action.kind is Kind.R:
        start = groups.layers(j).start
        return (("F", groups.forward_stage_holding(start - 1), m),) if start > 0 else ()
    return (("F", j, m),) if role == "last" else (("R", j, m), ("G", j - 1, m))


def dispatch(groups: PoolGroups, costs: Costs, *, num_devices: int, num_microbatches: int) -> Dispatched:
    """RoundPipe's rounds over the cut ``groups`` with per-job ``costs`` (see the module docstring)."""
    rows: list[list[Action]] = [[] for _ in range(num_devices)]
    free = [0.0] * num_devices
    done: dict[tuple, tuple[float, int]] = {}  # event -> (time, device)
    first = 0
    for start in range(0, num_microbatches, num_devices):
        microbatches = range(start, min(start + num_devices, num_microbatches))
        for job in range(groups.num_stages):
            device = (first + job) % num_devices
            for m in microbatches:
                for kind in _KINDS[groups.role(job)]:
                    action = Action(job, kind, m)
                    begin = free[device]
                    for event in _needs(groups, action):
                        at, where = done[event]
                        begin = max(begin, at + (costs.comm if where != device else 0.0))
                    free[device] = begin + _duration(costs, kind, job)
                    done[({Kind.F: "F", Kind.R: "R", Kind.B: "G"}[kind], job, m)] = (free[device], device)
                    rows[device].append(action)
        first = min(range(num_devices), key=lambda d: (free[d], d))
    meta = {**groups.meta(), "round_size": (num_devices,)}
    schedule = Schedule(rows, num_stages=groups.num_stages, num_microbatches=num_microbatches, stage_to_rank=None,
                        name="roundpipe-reference", layout="roundrobin", meta=meta)
    return Dispatched(schedule, costs, max(free), groups)


def _pack(times: Sequence[float], cap: float) -> tuple[int, ...]:
    """Greedy: fill each group up to ``cap`` in layer order (a layer above the cap gets a group alone)."""
    counts, total = [], None
    for t in times:
        if total is not None and total + t <= cap + 1e-12:
            counts[-1] += 1
            total += t
        else:
            counts.append(1)
            total = t
    return tuple(counts)


def roundpipe_cut(layer_costs: Costs, cap: float) -> PoolGroups:
    """The published greedy packing under one stage-time cap (the LM head is the last layer)."""
    count = len(layer_costs.forward)
    forward = [layer_value(layer_costs, "forward", i) for i in range(count)]
    backward = [layer_value(layer_costs, "backward_input", i) + layer_value(layer_costs, "backward_weight", i)
                for i in range(count)]
    last, fused = 1, forward[-1] + backward[-1]
    while last < count - 1 and fused + forward[-1 - last] + backward[-1 - last] <= cap + 1e-12:
        fused += forward[-1 - last] + backward[-1 - last]
        last += 1
    body = count - last
    recompute = [layer_value(layer_costs, "recompute", i) for i in range(body)]
    return PoolGroups(_pack(forward[:body], cap), last, _pack([r + b for r, b in zip(recompute, backward, strict=False)],
                                                                cap))


def roundpipe_cuts(layer_costs: Costs) -> list[PoolGroups]:
    """The distinct cuts of every cap from the slowest layer's job time to 1.1 times it."""
    count = len(layer_costs.forward)
    slowest = max(
        layer_value(layer_costs, "forward", i) + layer_value(layer_costs, "backward_input", i)
        + layer_value(layer_costs, "backward_weight", i)
        + (layer_value(layer_costs, "recompute", i) if i < count - 1 else 0.0)
        for i in range(count)
    )
    cuts = []
    for step in range(CAP_STEPS):
        groups = roundpipe_cut(layer_costs, slowest * (1.0 + 0.1 * step / (CAP_STEPS - 1)))
        if groups not in cuts:
            cuts.append(groups)
    return cuts


def roundpipe(layer_costs: Costs, *, num_devices: int, num_microbatches: int,
              extra_cuts: Sequence[PoolGroups] = ()) -> Dispatched:
    """The fastest RoundPipe dispatch over the published partitioner's cuts and any ``extra_cuts`` (e.g.
    the cut our generator chose, so a comparison isolates the dispatch)."""
    best = None
    for groups in [*roundpipe_cuts(layer_costs), *extra_cuts]:
        result = dispatch(groups, job_costs(layer_costs, groups), num_devices=num_devices,
                          num_microbatches=num_microbatches)
        if best is None or result.makespan < best.makespan - 1e-12:
            best = result
    return best


def lower_bound(layer_costs: Costs, *, num_devices: int, num_microbatches: int) -> float:
    """Total work / devices: F and R + B per layer, the LM head F + B without recompute."""
    count = len(layer_costs.forward)
    work = 0.0
    for i in range(count):
        work += layer_value(layer_costs, "forward", i) + layer_value(layer_costs, "backward_input", i)
        work += layer_value(layer_costs, "backward_weight", i)
        if i < count - 1:
            work += layer_value(layer_costs, "recompute", i)
    return work * num_microbatches / num_devices
