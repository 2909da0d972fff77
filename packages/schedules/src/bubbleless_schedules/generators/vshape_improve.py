"""What the V search does to its winner after the candidates (``vshape.search_v_schedule``): re-scheduled
cool-downs (``vshape_cooldown``) of the winner, the leading candidates and the shortest blocks reordered
wide, the exhaustive slot search at small unit-cost shapes, and a polish by local moves; with the two
helpers every step shares, timing fixed rows and ranking two results.
"""

from __future__ import annotations

from itertools import groupby, islice

from ..action import Kind
from ..costs import Costs
from ..placement import v_placement
from ..schedule import Schedule
from ..simulate import simulate
from .local_search import adjacent_swaps, independent, schedule_evaluator, schedule_fits, shifts
from .vshape_candidates import _MIN_TRIES_UP_TO, _fitting_pcm_blocks, _tokens_of_block
from .vshape_cooldown import COOL_DOWN, COOL_DOWN_ADMITTING, DEPTHS, recooled
from .vshape_exact import exact_slot_orders
from .vshape_fixed import time_fixed_order
from .vshape_greedy import GreedyResult, Policy, v_list_schedule
from .vshape_resume import tokens_of_rows


def _fixed_result(p: int, m: int, rows, costs: Costs, input_grad_frees: float) -> GreedyResult:
    """``rows`` (fixed V orders) timed: by ``vshape_fixed.time_fixed_order`` (a third of a simulation, no
    timeline built) when its order is ``rows`` itself, which holds whenever each chunk's W's follow its I's
    in order (tokens ``W0`` / ``W1`` run the oldest pending); else by the simulator. Same figures either way
    (tests/test_sched_v_fixed_timing.py compares them)."""
    times: list[list[tuple[float, float]]] = [[] for _ in range(p)]  # kept for the cool-down (vshape_resume)
    timed = time_fixed_order(p, m, costs, tokens_of_rows(p, rows), input_grad_frees, times=times)
    if timed is not None and timed.actions == tuple(map(tuple, rows)):
        peak = 2 * round(timed.peak_chunks / 2, 9)
        return GreedyResult(timed.actions, timed.makespan, timed.span_sum, peak, times=times)
    return _simulated_result(p, m, rows, costs, input_grad_frees)


def _simulated_result(p: int, m: int, rows, costs: Costs, input_grad_frees: float) -> GreedyResult:
    schedule = Schedule(rows, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
    timeline = simulate(schedule, costs, input_grad_frees=input_grad_frees)
    spans = sum(timeline.span_of(r) for r in range(p))
    return GreedyResult(schedule.actions, timeline.makespan, spans, 2 * timeline.max_peak_memory)


def _better(a: GreedyResult | None, b: GreedyResult | None) -> bool:
    if a is None:
        return False
    return b is None or (round(a.makespan, 9), round(a.span_sum, 9)) < (round(b.makespan, 9), round(b.span_sum, 9))


_LEADERS = 8
_COOL_DOWN_BUDGET = 150_000
"""The cool-down step (``vshape_cooldown``) re-schedules the winner and the ``_LEADERS`` fastest
candidates, each under two policies from eight depths, in that order, as many tries as
``_COOL_DOWN_BUDGET`` actions allow (all 144 up to p=7 m=22, 48 at p=16 m=32, about 0.5 s) and one for
shapes above 12,400 actions (0.15 s at p=32 m=256). The leaders matter: the polish reshuffles the
winner's order, and at p=7 and p=11 only a leading candidate's own order, re-cooled, meets the closed
form (at p=7 the eighth)."""


_WIDE_BLOCKS = 4
_WIDE_BUDGET = 100_000
"""Actions the wide step (``_wide_cool_down``) may schedule: the ``_WIDE_BLOCKS`` shortest fitting blocks,
each reordered within p actions and re-cooled from each of ``DEPTHS``, in that order (all 36 tries up to
p=12 m=12, 27 at p=14 m=43, about 0.3 s there)."""


def _wide_cool_down(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best):
    """``best`` or a faster one from the shortest PCM blocks reordered within p actions (a window as wide
    as the pipeline), their cool-downs re-scheduled. The cool-down step re-schedules the fastest candidates
    only, and these are not among them (p=12 m=12, unit costs: 55.5 against 52.5), yet re-cooled from depth
    3 or 4 they are what meets V-Half's closed form at m = p for even p >= 12 and at p=14 m=43 (51.0 -> 50.5
    at p=12 m=12, 60.0 -> 59.5 at p=14 m=14, 69.0 -> 68.5 at p=16 m=16, 147.0 -> 146.5 at p=14 m=43)."""
    per_try, spent = 6 * p * m, 0
    wide = Policy(fill_w=False, lookahead=p)
    for block, _ in islice(_fitting_pcm_blocks(p, m, cap_chunks), _WIDE_BLOCKS):
        base = v_list_schedule(p, m, costs, cap_chunks, wide, input_grad_frees, _tokens_of_block(p, m, block))
        spent += per_try
        if base is None or base.peak_chunks > cap_chunks + 1e-9:
            continue
        for depth in DEPTHS:
            if spent + per_try > _WIDE_BUDGET:
                return best
            spent += per_try
            for result in recooled(p, m, costs, cap_chunks, input_grad_frees, base, (depth,), COOL_DOWN):
                if _better(result, best):
                    best = result
    return best


def _cool_down(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best, leaders):
    """The fastest of ``best`` and of ``best`` and ``leaders`` with their cool-downs re-scheduled
    (``vshape_cooldown.recooled``), tried in the order and number ``_COOL_DOWN_BUDGET`` describes."""
    per_try = 6 * p * m
    tries = 1 if per_try > _MIN_TRIES_UP_TO else max(1, _COOL_DOWN_BUDGET // per_try)
    plan, seen = [], []
    for base in (best, *leaders):
        if any(base.actions == other.actions for other in seen):
            continue
        seen.append(base)
        plan += [(base, policy, depth) for policy in (COOL_DOWN, COOL_DOWN_ADMITTING) for depth in DEPTHS]
    for (_, policy), group in groupby(plan[:tries], key=lambda item: (id(item[0]), item[1])):
        group = list(group)  # one base, one policy: recooled times the base once for all its depths
        depths = [depth for _, _, depth in group]
        for result in recooled(p, m, costs, cap_chunks, input_grad_frees, group[0][0], depths, policy):
            if _better(result, best):
                best = result
    return best


_EXACT_RANKS_UP_TO = 4
_EXACT_UP_TO = 800
_EXACT_BUDGET = 20_000
"""Ranks and actions up to which even unit costs also get the exhaustive slot search (``vshape_exact``),
and its budget in slot choices for the first makespan it tries (halved for each shorter one). At p=4 it
settles a question in a few thousand choices; at p=8 the budget runs out (measured at m=16: nothing
found in 10^6), so larger p is not asked."""


def _exact(p: int, m: int, costs: Costs, cap_chunks: float, best: GreedyResult) -> GreedyResult:
    """At even unit costs (one cost for every chunk pass, no comm), ask the exhaustive slot search for a
    schedule one slot shorter than the best so far, then shorter again, while it finds one in budget."""
    passes = {costs.of(kind, s, 2) for kind in (Kind.F, Kind.I, Kind.W) for s in range(2 * p)}
    if len(passes) != 1 or costs.comm != 0:
        return best
    slot = passes.pop()
    if slot <= 0:
        return best
    budget = _EXACT_BUDGET
    target = round(best.makespan / slot) - 1
    while budget > 0 and target >= 6 * m:
        rows = exact_slot_orders(p, m, cap_chunks, target, node_budget=budget)
        budget //= 2  # each shorter target is a harder question; stop before it costs more than the first
        if rows is None:
            break
        found = _fixed_result(p, m, rows, costs, 0.0)
        if found.peak_chunks > cap_chunks + 1e-9 or not _better(found, best):
            break
        best = found
        target = round(best.makespan / slot) - 1
    return best


_LOCAL_SEARCH_UP_TO = 2_000
_LOCAL_SEARCH_BUDGET = 1.5e5
"""Actions up to which the winner is polished by adjacent swaps, then by moves of one action a few places
(``local_search.shifts``), and each search's budget in evaluated actions (about 0.1-0.2 s each)."""


def _polish(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best: GreedyResult):
    """Swap adjacent independent actions, then move single ones a few places, while the simulated makespan
    improves within the cap."""
    schedule = Schedule(best.actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
    rows, makespan = schedule.actions, best.makespan
    for search in (adjacent_swaps, shifts):
        rows, makespan = search(
            rows, schedule_evaluator(schedule, costs), can_swap=independent,
            fits=schedule_fits(schedule, cap_chunks / 2, input_grad_frees), best=makespan,
            budget=_LOCAL_SEARCH_BUDGET,
        )
    if makespan < best.makespan - 1e-9:
        return GreedyResult(tuple(tuple(r) for r in rows), makespan, best.span_sum, best.peak_chunks)
    return best
