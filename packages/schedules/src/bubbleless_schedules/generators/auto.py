"""``auto``: simulate every registered stage-bound schedule that fits and return the fastest.

Each registered generator (``auto`` itself excepted) is asked for a schedule of this shape under the
same ``memory_limit``; those that refuse the shape or the limit (``ValueError``), those that fail (any
other ``Exception``: a custom generator's bug, skipped with a ``RuntimeWarning`` naming it, so that one broken
generator does not break ``auto`` for every shape) and those that are not stage-bound (``stage_to_rank is
None``, e.g. round-robin pools, which need a different runtime) are skipped. The rest are simulated
under the given costs, and the one with the smallest makespan wins (ties: lower peak memory, then the
order tried). Generators are tried lowest lower bound first
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
(``simulated_makespan``), or not at all when their generator already timed the very order it returned
(``fn.makespan_of``: the V family's search, cached); the registry validates the winner. A generator that
publishes no placement (interleaved 1F1B) is built, then bounded by its schedule and put back in line, so at
p=32, m=256 on the paper's profile under limit 64 it is not simulated either.
"""

from __future__ import annotations

import heapq
import warnings
from functools import cache

from ..action import Kind
from ..costs import Costs, StageCountError
from ..registry import available, generate, generator, register
from ..schedule import Schedule
from ..simulate import peak_memory, simulated_makespan
from .bounds import placement_bound

SELF = "auto"


def stage_bound_candidates(
    *, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None,
    input_grad_frees: float, refused: list[tuple[str, Exception]] | None = None,
) -> list[tuple[float, float, Schedule]]:
    """(makespan, peak memory, schedule) of the registered stage-bound schedules that fit.

    Tried lowest bound first; a generator whose lower bound (``bounds.placement_bound``, or a memory bound it
    publishes) is above the best makespan found so far is skipped, and so is one whose bound equals it unless
    its declared peak is below the best's (it could at most tie, and ties go to the lower peak). One that
    publishes no placement is built at its turn and goes back in line under the bound of the schedule it
    built (``_built_bound``): interleaved 1F1B, whose chunks are an option, is then skipped once ZB-V is in hand
    at p=32, m=256 on the paper's profile instead of simulated. The list is in registry order among equal bounds
    and lowest bound (unpublished placements first) otherwise, the order ties are decided in, as before such
    schedules went back in line. Each generator that refused (``ValueError``) or failed (another
    ``Exception``, also warned of) is appended to ``refused`` with its error, when given."""
    names = [name for name in available() if name != SELF and _stage_bound(name)]
    bounds = {name: _bound(name, num_ranks, num_microbatches, costs, memory_limit, input_grad_frees) for name in names}
    cap = float("inf") if memory_limit is None else memory_limit
    frugal = {name: min(cap, _peak_hint(name, num_ranks, num_microbatches)) for name in names}
    line = [(bounds[n], frugal[n], names.index(n), n, None) for n in names]  # None: not built yet
    heapq.heapify(line)
    found, best, best_peak = [], float("inf"), float("inf")
    while line:
        bound, _, position, name, schedule = heapq.heappop(line)
        if schedule is not None and bound > best + 1e-6:
            continue  # back in line with its own schedule's bound: it could not be faster (nor tie)
        if schedule is None and (bound > best + 1e-9 or (bound >= best - 1e-9 and frugal[name] >= best_peak - 1e-9)):
            continue  # it could not be faster, nor tie with less memory (ties go to the lower peak)
        try:
            if schedule is None:
                schedule = generate(
                    name, num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs,
                    memory_limit=memory_limit, input_grad_frees=input_grad_frees, validated=False,
                )
                if schedule.stage_to_rank is None:
                    continue
                if getattr(generator(name), "placement_of", None) is None:
                    heapq.heappush(line, (_built_bound(schedule, costs), frugal[name], position, name, schedule))
                    continue
            makespan = _makespan(name, schedule, costs, memory_limit, input_grad_frees)
        except ValueError as exc:  # this shape, limit or per-stage cost list is not one it supports
            if refused is not None:
                refused.append((name, exc))
            continue
        except Exception as exc:  # a generator's bug: skip it as one that cannot run, and say so
            warnings.warn(f"auto skipped generator {name!r}, which failed: {_failure(exc)}", RuntimeWarning,
                          stacklevel=2)
            if refused is not None:
                refused.append((name, exc))
            continue
        peak = max(peak_memory(schedule, input_grad_frees), default=0.0)
        found.append((position, (makespan, peak, schedule)))
        if (round(makespan, 9), peak) < (round(best, 9), best_peak):
            best, best_peak = makespan, peak
    first_in_line = sorted(names, key=lambda n: (bounds[n], frugal[n], names.index(n)))
    return [entry for _, entry in sorted(found, key=lambda item: first_in_line.index(names[item[0]]))]


def _built_bound(schedule: Schedule, costs: Costs) -> float:
    """The placement bound of a built schedule (``bounds.placement_bound``), with the B chain below each rank
    when it runs forwards and fused backwards only."""
    fused = all(action.kind in (Kind.F, Kind.B) for row in schedule.actions for action in row)
    return placement_bound(schedule.stage_to_rank, schedule.num_microbatches, costs, fused_backward=fused)


def _makespan(name: str, schedule: Schedule, costs: Costs, memory_limit: float | None, input_grad_frees: float):
    """The simulated makespan of ``schedule``: the one its generator already timed when it publishes it
    (``fn.makespan_of``, the V family's cached search) for this very order, else simulated."""
    makespan_of = getattr(generator(name), "makespan_of", None)
    if makespan_of is not None:
        known = makespan_of(schedule, costs, memory_limit, input_grad_frees)
        if known is not None:
            return known
    return simulated_makespan(schedule, costs)


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
    that shape is refused or fails: the full shape is then tried and checked)."""
    try:
        return generate(name, num_ranks=2, num_microbatches=2).stage_to_rank is not None
    except Exception:  # refused or failed: the full shape is tried, then skipped (or warned of)
        return True


def _failure(exc: Exception) -> str:
    """``IndexError: list index out of range``: the type says what kind of bug, the text where."""
    return f"{type(exc).__name__}: {exc}"


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
    refused: list[tuple[str, Exception]] = []
    found = stage_bound_candidates(
        num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs,
        memory_limit=memory_limit, input_grad_frees=input_grad_frees, refused=refused,
    )
    if not found and refused and all(isinstance(exc, StageCountError) for _, exc in refused):
        # Every candidate refused the per-stage costs' length: say so, as each generator on its own
        # does; raising the memory limit, which the message below suggests first, would not help.
        counts = " or ".join(str(n) for n in sorted({exc.num_stages for _, exc in refused}))
        raise ValueError(
            f"costs give {refused[0][1].given} per-stage values but every stage-bound schedule for "
            f"num_ranks={num_ranks} has {counts} stages; give one value per stage or single numbers"
        )
    failed = [(name, exc) for name, exc in refused if not isinstance(exc, ValueError)]
    if not found:
        raise ValueError(
            f"auto found no stage-bound schedule for num_ranks={num_ranks}, num_microbatches={num_microbatches}"
            f" under memory_limit={memory_limit} M_B and the given costs; raise memory_limit (1F1B needs "
            f"min(num_ranks, num_microbatches) M_B) or give one cost per stage of a one-stage-per-rank pipeline"
            + "".join(f"; generator {name!r} failed: {_failure(exc)}" for name, exc in failed)
        )
    best = min(range(len(found)), key=lambda i: (round(found[i][0], 9), found[i][1], i))
    return found[best][2]


auto.median_checked = True  # see the module docstring: the registry's median re-run is redundant here
