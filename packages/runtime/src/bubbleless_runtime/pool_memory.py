"""Whether a round-robin plan fits ``memory_budget`` bytes per device, decided before anything runs.

A device's peak is found by the walk ``pool_plan_cap.plan_peak_bytes`` makes over its actions
(``device_peak_walk``), so the automatic plan held to the budget passes this check: the weights of the
jobs it holds at once (the current ones and the prefetched), here as the host store holds them, plus
every micro-batch held from its R to its backward (``held_microbatch_bytes``: the activations autograd
saves through the group, from a profile when there is one, its uploaded input in full and the larger of
the gradient it hands down and the one its B uploads), two or more when the plan recomputes ahead or
defers W past I (from a split backward's I to its W, what its deferred weight gradients keep instead:
``kept_until_w_bytes``), a forward job's uploaded input while its F runs (``forward_input_bytes``), and at layer
0 the copy of the caller's micro-batch a GPU worker makes (``input_bytes``). Without a profile only the
weights are checked here; the executor's run-time accounting (``bubbleless_offload.MemoryBudget``)
catches the rest in the first step.
"""

from __future__ import annotations

from bubbleless_offload import format_bytes as _mb
from bubbleless_schedules import Schedule
from bubbleless_schedules.roundrobin_layout import pool_groups

from .pool_plan_cap import device_peak_walk, forward_input_bytes, held_microbatch_bytes, kept_until_w_bytes


def device_peaks(schedule: Schedule, store, profile=None, input_bytes: float = 0.0) -> list[tuple[float, str]]:
    """Per device: (peak bytes, how it is made up), as ``check_fits`` counts them; ``input_bytes``: one
    micro-batch of the caller's input as a GPU worker copies it (0 for CPU devices)."""
    groups = pool_groups(schedule)
    weights = [store.weight_bytes(list(groups.layers(j))) for j in range(groups.num_stages)]
    held = [held_microbatch_bytes(groups, j, profile, input_bytes) for j in range(groups.num_stages)]
    passing = [forward_input_bytes(groups, j, profile, input_bytes) for j in range(groups.num_stages)]
    kept = [kept_until_w_bytes(groups, j, profile) for j in range(groups.num_stages)]
    return [(peak.bytes, _made_up(peak, weights)) for peak in device_peak_walk(schedule, weights, held, passing, kept)]


def _made_up(peak, weights) -> str:
    if not peak.jobs:
        return "no jobs"
    parts = [f"job {j}'s weights {_mb(weights[j])}" for j in peak.jobs]
    if peak.microbatches:
        pairs = ", ".join(f"{job}/{mb}" for job, mb in peak.microbatches)
        parts.append(f"{len(peak.microbatches)} micro-batches held for their backward (job/micro-batch {pairs}) "
                     f"{_mb(peak.held)}")
    if peak.passing:
        parts.append(f"a forward job's uploaded input {_mb(peak.passing)}")
    return " + ".join(parts)


def check_fits(schedule: Schedule, store, budget: float | None, devices, profile=None,
               input_bytes: float = 0.0) -> None:
    """ValueError naming the device, its peak and what makes it up, when the plan exceeds ``budget``."""
    if budget is None:
        return
    for index, (peak, why) in enumerate(device_peaks(schedule, store, profile, input_bytes)):
        if peak > budget:
            groups = pool_groups(schedule)
            raise ValueError(
                f"the round-robin plan does not fit memory_budget={_mb(budget)} per device: device {index} "
                f"({devices[index]}) needs {_mb(peak)} at its peak ({why}); groups forward={list(groups.forward)} "
                f"last={groups.last} backward={list(groups.backward)} with {schedule.num_microbatches} micro-batches. "
                "Raise memory_budget, cut smaller groups (partition='auto' with the budget, or more backward "
                "groups), use more micro-batches of the same batch, or shorter sequences"
            )
