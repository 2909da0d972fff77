"""``auto``: simulate every registered stage-bound schedule that fits and return the fastest.

Each registered generator (``auto`` itself excepted) is asked for a schedule of this shape under the
same ``memory_limit``; those that refuse the shape or the limit (``ValueError``) and those that are not
stage-bound (``stage_to_rank is None``, e.g. round-robin pools, which need a different runtime) are
skipped. The rest are simulated under the given costs, and the one with the smallest makespan wins
(ties: lower peak memory, then the order tried). Generators are tried lowest lower bound first
(``bounds``: the placement's, or a memory bound the generator publishes, as the V family does; among
equal bounds the one with the lowest declared peak first), and one whose bound is above the best
makespan so far is skipped, as is one whose bound equals it without a lower declared peak: it could at
most tie (at unit costs and m >= 2p ZB-V reaches the V placement's bound, so DualPipeV and the one-chunk
schedules are not built; at p=32, m=256 on the paper's profile V-Min's and V-Half's caps forbid
reaching ZB-V's makespan, so their searches are not run either). The returned
schedule keeps its generator's name, so the choice is visible.

Speed (p=32, m=256 is the issue's yardstick): a generator is asked for the full shape only once a
two-rank probe has shown it stage-bound, so a round-robin pool is never built just to be dropped; and
``auto`` does not go through the registry's median re-run for uneven per-stage costs
(``auto.median_checked``): each candidate already had it, so the median-steered ``auto`` could only pick one
of the schedules already compared under the true costs. Candidates skip the validator (simulating them
raises on a deadlock or a missing action) and are timed without building their timelines
(``simulated_makespan``); the registry validates the winner.
"""

from __future__ import annotations

from functools import cache

from ..costs import Costs
from ..registry import available, generate, generator, register
from ..schedule import Schedule
from ..simulate import peak_memory, simulated_makespan
from .bounds import placement_bound

SELF = "auto"


def stage_bound_candidates(
    *, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None, input_grad_frees: float
) -> list[tuple[float, float, Schedule]]:
    """(makespan, peak memory, schedule) of the registered stage-bound schedules that fit, lowest bound first.

    A generator whose lower bound (``bounds.placement_bound``, or a memory bound it publishes) is above the
    best makespan found so far is skipped, and so is one whose bound equals it unless its declared peak is
    below the best's (it could at most tie, and ties go to the lower peak). The list is in the order tried (bound, then registry order)."""
    names = [name for name in available() if name != SELF and _stage_bound(name)]
    bounds = {name: _bound(name, num_ranks, num_microbatches, costs, memory_limit, input_grad_frees) for name in names}
    found, best = [], float("inf")
    cap = float("inf") if memory_limit is None else memory_limit
    frugal = {name: min(cap, _peak_hint(name, num_ranks, num_microbatches)) for name in names}
    best_peak = float("inf")
    for name in sorted(names, key=lambda n: (bounds[n], frugal[n], names.index(n))):
        if bounds[name] > best + 1e-9 or (bounds[name] >= best - 1e-9 and frugal[name] >= best_peak - 1e-9):
            continue  # it could not be faster, nor tie with less memory (ties go to the lower peak)
        try:
            schedule = generate(
                name, num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs,
                memory_limit=memory_limit, input_grad_frees=input_grad_frees, validated=False,
            )
            if schedule.stage_to_rank is None:
                continue
            makespan = simulated_makespan(schedule, costs)
        except ValueError:  # this shape, limit or per-stage cost list is not one it supports
            continue
        peak = max(peak_memory(schedule, input_grad_frees), default=0.0)
        found.append((makespan, peak, schedule))
        if (round(makespan, 9), peak) < (round(best, 9), best_peak):
            best, best_peak = makespan, peak
    return found


def _peak_hint(name: str, num_ranks: int, num_microbatches: int) -> float:
    peak_of = getattr(generator(name), "peak_of", None)
    return float("inf") if peak_of is None else float(peak_of(num_ranks, num_microbatches))


def _bound(name: str, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None,
           input_grad_frees: float) -> float:
    fn = generator(name)
    placement_of = getattr(fn, "placement_of", None)
    if placement_of is None:
        return 0.0
    bound = placement_bound(placement_of(num_ranks), num_microbatches, costs)
    memory_bound_of = getattr(fn, "memory_bound_of", None)
    if memory_bound_of is not None and input_grad_frees == 0.0:  # the memory bound assumes I frees nothing
        bound = max(bound, memory_bound_of(num_ranks, num_microbatches, costs, memory_limit))
    return bound


@cache
def _stage_bound(name: str) -> bool:
    """Whether ``name`` places stages on ranks, read off a two-rank, two-micro-batch schedule (True when
    that shape is refused: the full shape is then tried and checked)."""
    try:
        return generate(name, num_ranks=2, num_microbatches=2).stage_to_rank is not None
    except ValueError:
        return True


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


auto.median_checked = True  # see the module docstring: the registry's median re-run is redundant here
