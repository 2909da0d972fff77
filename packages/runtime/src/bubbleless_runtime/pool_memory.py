"""Whether a round-robin plan fits ``memory_budget`` bytes per device, decided before anything runs.

A device's peak is the weights of two consecutive jobs on it (the next job's weights prefetch while
the current one computes) plus, for a gradient job, what one micro-batch keeps for its backward: the
activations autograd saves through the group (from a profile, when there is one), its uploaded input
(once, where the group's first layer saves it) and the gradient handed to it. Without a profile only the weights are checked here; the executor's
run-time accounting (``bubbleless_offload.MemoryBudget``) catches the rest in the first step.
"""

from __future__ import annotations

from bubbleless_offload import format_bytes as _mb
from bubbleless_schedules import Schedule
from bubbleless_schedules.roundrobin_layout import pool_groups


def device_peaks(schedule: Schedule, store, profile=None) -> list[tuple[float, str]]:
    """Per device: (peak bytes, how it is made up), as ``check_fits`` counts them."""
    groups = pool_groups(schedule)
    peaks = []
    for actions in schedule.actions:
        jobs = list(dict.fromkeys(a.stage for a in actions))
        weights = {j: store.weight_bytes(list(groups.layers(j))) for j in jobs}
        worst, why = 0.0, "no jobs"
        for position, job in enumerate(jobs):
            upcoming = jobs[position + 1] if position + 1 < len(jobs) else None
            held = weights[job] + (weights[upcoming] if upcoming is not None else 0)
            acts = _activation_bytes(groups, job, profile)
            if held + acts > worst:
                worst = held + acts
                pair = f"job {job}'s weights {_mb(weights[job])}"
                if upcoming is not None:
                    pair += f" + job {upcoming}'s prefetched {_mb(weights[upcoming])}"
                why = pair + (f" + one micro-batch's activations of job {job} {_mb(acts)}" if acts else "")
        peaks.append((worst, why))
    return peaks


def _activation_bytes(groups, job: int, profile) -> float:
    """One micro-batch of gradient job ``job`` at its backward: its uploaded input, what autograd saves
    through the group, and the output gradient handed down, each storage once, as the executor counts
    them (``pool_worker``). A profile's saved bytes already hold a layer's input where the layer saves
    it (``bubbleless_partition`` counts every saved storage: a transformer block's first norm saves its
    input), so the upload only adds the part of the input the group's first layer does not keep; the
    output gradient is a new tensor beside them."""
    if profile is None or groups.role(job) == "forward":
        return 0.0
    tokens = profile.tokens_per_microbatch
    layers = groups.layers(job)
    saved = sum(profile.layers[i].activation_bytes_per_token for i in layers) * tokens
    boundary = profile.layers[layers.start - 1].output_bytes_per_token * tokens if layers.start > 0 else 0.0
    first_saved = profile.layers[layers.start].activation_bytes_per_token * tokens
    return saved + max(0.0, boundary - first_saved) + boundary


def check_fits(schedule: Schedule, store, budget: float | None, devices, profile=None) -> None:
    """ValueError naming the device, its peak and what makes it up, when the plan exceeds ``budget``."""
    if budget is None:
        return
    for index, (peak, why) in enumerate(device_peaks(schedule, store, profile)):
        if peak > budget:
            groups = pool_groups(schedule)
            raise ValueError(
                f"the round-robin plan does not fit memory_budget={_mb(budget)} per device: device {index} "
                f"({devices[index]}) needs {_mb(peak)} at its peak ({why}); groups forward={list(groups.forward)} "
                f"last={groups.last} backward={list(groups.backward)} with {schedule.num_microbatches} micro-batches. "
                "Raise memory_budget, cut smaller groups (partition='auto' with the budget, or more backward "
                "groups), use more micro-batches of the same batch, or shorter sequences"
            )
