"""``auto``: simulate every registered stage-bound schedule that fits and return the fastest.

Each registered generator (``auto`` itself excepted) is asked for a schedule of this shape under the
same ``memory_limit``; those that refuse the shape or the limit (``ValueError``) and those that are not
stage-bound (``stage_to_rank is None``, e.g. round-robin pools, which need a different runtime) are
skipped. The rest are simulated under the given costs, and the one with the smallest makespan wins
(ties: lower peak memory, then registration order). The returned schedule keeps its generator's name,
so the choice is visible.
"""

from __future__ import annotations

from ..costs import Costs
from ..registry import available, generate, register
from ..schedule import Schedule
from ..simulate import simulate

SELF = "auto"


def stage_bound_candidates(
    *, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None, input_grad_frees: float
) -> list[tuple[float, float, Schedule]]:
    """(makespan, peak memory, schedule) of every registered stage-bound schedule that fits, in registry order."""
    found = []
    for name in available():
        if name == SELF:
            continue
        try:
            schedule = generate(
                name, num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs,
                memory_limit=memory_limit, input_grad_frees=input_grad_frees,
            )
            if schedule.stage_to_rank is None:
                continue
            timeline = simulate(schedule, costs, input_grad_frees=input_grad_frees)
        except ValueError:  # this shape, limit or per-stage cost list is not one it supports
            continue
        found.append((timeline.makespan, timeline.max_peak_memory, schedule))
    return found


@register(SELF)
def auto(
    *,
    num_ranks: int,
    num_microbatches: int,
    costs: Costs,
    memory_limit: float | None,
    input_grad_frees: float = 0.0,
) -> Schedule:
    """The fastest registered stage-bound schedule under ``costs`` whose peak fits ``memory_limit``."""
    found = stage_bound_candidates(
        num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs,
        memory_limit=memory_limit, input_grad_frees=input_grad_frees,
    )
    if not found:
        raise ValueError(
            f"auto found no stage-bound schedule for num_ranks={num_ranks}, num_microbatches={num_microbatches}"
            f" under memory_limit={memory_limit} M_B and the given costs; raise memory_limit (1F1B needs "
            f"min(num_ranks, num_microbatches) M_B) or give one cost per stage of a one-stage-per-rank pipeline"
        )
    best = min(range(len(found)), key=lambda i: (round(found[i][0], 9), found[i][1], i))
    return found[best][2]
