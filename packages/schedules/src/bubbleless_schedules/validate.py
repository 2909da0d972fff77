"""One validator for every schedule: shape, placement, completeness, and freedom from deadlock."""

from __future__ import annotations

from .action import STAGE_KINDS
from .costs import Costs
from .schedule import Schedule
from .simulate import _render_error, require_complete, run_order


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
    for worker, row in enumerate(schedule.actions):
        if not _row_in_range(schedule, worker, row):
            for position, action in enumerate(row):
                problem = _action_problem(schedule, worker, action)
                if problem:
                    raise ValueError(_render_error(schedule, [(worker, position)], problem))
    require_complete(schedule, "validate")
    run_order(schedule, Costs.unit())  # raises on deadlock; the timeline itself is not needed here
    return schedule


def _row_in_range(schedule: Schedule, worker: int, row) -> bool:
    """True when ``_action_problem`` finds nothing in ``row`` (one pass, for the usual valid case)."""
    mbs, placement = schedule.num_microbatches, schedule.stage_to_rank
    if placement is None:
        stages = range(schedule.num_stages)
    else:
        stages = {s for s, rank in enumerate(placement) if rank == worker}
    return all(a.stage in stages and (a.kind in STAGE_KINDS or a.microbatch < mbs) for a in row)


def _action_problem(schedule: Schedule, worker: int, action) -> str | None:
    """Why ``action`` cannot run on ``worker``: a stage or micro-batch out of range, or the wrong rank."""
    placement = schedule.stage_to_rank
    if action.stage >= schedule.num_stages:
        return f"{action}: stage {action.stage} is out of range (the schedule has {schedule.num_stages} stages)"
    if action.kind not in STAGE_KINDS and action.microbatch >= schedule.num_microbatches:
        return (
            f"{action}: micro-batch {action.microbatch} is out of range "
            f"(the schedule has {schedule.num_microbatches} micro-batches)"
        )
    if placement is not None and placement[action.stage] != worker:
        return f"{action} runs on rank {worker} but stage {action.stage} is placed on rank {placement[action.stage]}"
    return None
