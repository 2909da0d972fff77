"""Checks both pipelines (``Pipeline``, ``RoundRobinPipeline``) make of the arguments they share, with one
wording, before anything is built. No torch here: ``config_checks`` uses them to check a config."""

from __future__ import annotations

from collections.abc import Callable

from bubbleless_schedules import Schedule, available, generate


def check_common(loss_fn: Callable | None, num_microbatches, timeout) -> None:
    """ValueError for a missing loss, a non-positive micro-batch count or timeout."""
    if loss_fn is None or not callable(loss_fn):
        raise ValueError("loss_fn is required: pass loss_fn=callable(output, target) -> scalar Tensor")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be a positive integer, got {num_microbatches!r}")
    if not timeout > 0:
        raise ValueError(f"timeout is in seconds and must be positive, got {timeout!r}")


def check_microbatches(schedule: Schedule, num_microbatches: int) -> None:
    """ValueError when a given schedule was made for another number of micro-batches."""
    if schedule.num_microbatches != num_microbatches:
        raise ValueError(
            f"schedule {schedule.name!r} has {schedule.num_microbatches} micro-batches but num_microbatches="
            f"{num_microbatches}; pass num_microbatches={schedule.num_microbatches}"
        )


def stage_bound_names() -> list[str]:
    """The registered schedules whose stages are bound to ranks (what ``Pipeline`` runs). A generator's
    placement does not depend on the shape, so one small shape classifies it."""
    names = []
    for name in available():
        try:
            if generate(name, num_ranks=2, num_microbatches=8).stage_to_rank is not None:
                names.append(name)
        except (ValueError, NotImplementedError):
            pass
    return names


def require_stage_bound(schedule: Schedule) -> Schedule:
    """``schedule``, or ValueError when it dispatches stage jobs to a pool instead of binding stages to ranks."""
    if schedule.stage_to_rank is None:
        raise ValueError(
            f"{schedule.name or 'this schedule'} dispatches stage jobs to a device pool (layout {schedule.layout!r}); "
            f"Pipeline runs stage-bound schedules; pick one of {stage_bound_names()}"
        )
    return schedule
