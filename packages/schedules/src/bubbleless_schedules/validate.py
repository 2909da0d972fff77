"""One validator for every schedule: shape, placement, completeness, and freedom from deadlock."""

from __future__ import annotations

from .action import STAGE_KINDS
from .layouts import layout_of
from .schedule import Schedule
from .simulate import _render_error, simulate


def validate(schedule: Schedule) -> Schedule:
    """Return ``schedule`` unchanged if it can run; otherwise raise ``ValueError`` showing where it fails.

    Checks, in order: the shape (stage and micro-batch indices in range, a placement with one rank per
    stage), that every action runs on the rank its stage is placed on, that each stage and micro-batch
    has exactly the actions the layout needs, and that the schedule runs to the end without deadlock.
    """
    if schedule.num_workers < 1:
        raise ValueError("a schedule needs at least one worker (rank); it has none")
    if schedule.num_stages < 1 or schedule.num_microbatches < 1:
        raise ValueError(
            f"a schedule needs at least one stage and one micro-batch; it has {schedule.num_stages} "
            f"stages and {schedule.num_microbatches} micro-batches"
        )
    placement = schedule.stage_to_rank
    if placement is not None:
        if len(placement) != schedule.num_stages:
            raise ValueError(
                f"placement lists {len(placement)} ranks but the schedule has {schedule.num_stages} stages; "
                f"give one rank per stage"
            )
        bad = [r for r in placement if not 0 <= r < schedule.num_workers]
        if bad:
            raise ValueError(f"placement names ranks {bad} outside 0..{schedule.num_workers - 1}")
    for worker, position, action in schedule.all_actions():
        problem = None
        if action.stage >= schedule.num_stages:
            problem = f"{action}: stage {action.stage} is out of range (the schedule has {schedule.num_stages} stages)"
        elif action.kind not in STAGE_KINDS and action.microbatch >= schedule.num_microbatches:
            problem = (
                f"{action}: micro-batch {action.microbatch} is out of range "
                f"(the schedule has {schedule.num_microbatches} micro-batches)"
            )
        elif placement is not None and placement[action.stage] != worker:
            problem = f"{action} runs on rank {worker} but stage {action.stage} is placed on rank {placement[action.stage]}"
        if problem:
            raise ValueError(_render_error(schedule, [(worker, position)], problem))
    problems = layout_of(schedule).missing(schedule)
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise ValueError(_render_error(schedule, [], f"incomplete schedule:\n  {shown}"))
    simulate(schedule)
    return schedule
