"""``zb`` (alias ``zerobubble``): the automatic zero-bubble scheduler, cost-aware and memory-bounded.

It builds candidate orders and keeps the one with the smallest simulated makespan (ties: lower peak):

- the greedy list scheduler of ``zb_greedy`` (I first, then F within the warm-up depth and the memory
  limit, then W into the gaps) under several warm-up depths: 1F1B's p-r, ZB-H2's 2(p-r)-1, the depth
  that covers each rank's round trip under the given per-stage costs and comm, and "as deep as memory
  allows"; each with W filling every gap or only the gaps it fits in;
- the delayed-W orders of ZB-H1 and ZB-H2 (``zb_handcrafted``) where their peak fits the limit, and
  1F1B with the backward split.

Because the handcrafted schedules are among the candidates, ``zb`` is never slower than ZB-H1 (or
ZB-H2, when the limit allows 2p-1) under the same costs. Every candidate is timed with the simulator's
own rule, so the reported choice is the simulator's.

Default ``memory_limit``: p M_B, the peak of 1F1B, so switching from 1F1B to ``zb`` never needs more
activation memory (the paper's ZB-1p). Pass ``memory_limit=2*num_ranks`` for ZB-2p.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..action import Kind
from ..costs import Costs
from ..placement import loop_placement
from ..registry import register
from ..schedule import Schedule
from .local_search import adjacent_swaps
from .zb_greedy import INF, GreedyPolicy, evaluate_orders, run_greedy, stage_costs, to_actions
from .zb_handcrafted import delayed_w_pairs
from .zb_heuristic import distinct_runs, heuristic_orders

_LARGE = 4096  # p * m above which only the most useful candidates are tried (keeps p=32, m=256 fast)


def round_trip_depth(num_ranks: int, costs: Costs) -> tuple[int, ...]:
    """Per rank: the forwards that fit between its first forward and its first gradient's arrival, plus one."""
    p = num_ranks
    cf, ci, _ = stage_costs(costs, p)
    comm = float(costs.comm)
    depth = []
    for r in range(p):
        trip = sum(cf[s] + ci[s] + 2 * comm for s in range(r + 1, p))
        depth.append(1 + (math.floor(trip / cf[r] + 1e-9) if cf[r] > 0 else p))
    return tuple(depth)


def _depth_families(p: int, m: int, costs: Costs, limit: float) -> dict[str, tuple[int, ...]]:
    trip = round_trip_depth(p, costs)
    families = {
        "1f1b": tuple(p - r for r in range(p)),
        "h2": tuple(2 * (p - r) - 1 for r in range(p)),
        "round-trip": trip,
        "round-trip+1": tuple(d + 1 for d in trip),
        "memory": tuple([max(1, math.floor(limit + 1e-9))] * p),
    }
    return {name: tuple(min(max(d, 1), m) for d in depth) for name, depth in families.items()}


def _pattern_candidates(p: int, m: int, limit: float) -> list[tuple]:
    """Delayed-W orders (ZB-H1 at depth 1, ZB-H2 at depth 2, 1F1B split) whose peak fits ``limit``."""
    candidates = []
    for depth in range(1, 3):
        warmup = [depth * (p - 1 - r) for r in range(p)]
        lag = [depth * r for r in range(p)]
        peak = min(m, depth * (p - 1) + 1)  # warmup + 1 + lag, the same on every rank
        if peak <= limit + 1e-9:
            candidates.append([delayed_w_pairs(m, warmup[r], lag[r]) for r in range(p)])
    one_f_one_b = [delayed_w_pairs(m, p - 1 - r, 0) for r in range(p)]
    if min(m, p) <= limit + 1e-9:
        candidates.append(one_f_one_b)
    return candidates


def _fits_orders(limit: float, frees: float):
    """``fits`` for one rank's (kind, micro-batch) order: held activations never above ``limit``."""
    bound, kind_f, kind_i = limit + 1e-9, Kind.F, Kind.I

    def fits(rank: int, row) -> bool:
        held = 0.0
        for kind, _ in row:
            held += 1.0 if kind is kind_f else -frees if kind is kind_i else frees - 1.0
            if held > bound:
                return False
        return True

    return fits


def _can_swap(a, b) -> bool:
    return a[0] is not b[0] and a[1] != b[1]


SEARCH_BUDGET = 2e5
"""Actions the local search may evaluate (about 0.1 s). Shapes too large for 200 evaluations of it
(p * m > 1000) skip the search: it could not get far, and their gaps are the ramp's, not the order's."""


def best_orders(
    p: int, m: int, costs: Costs, limit: float, input_grad_frees: float = 0.0, *, first=None
) -> tuple[tuple, float]:
    """(orders, makespan): ``first`` unless ``search`` finds a strictly faster order (handcrafted orders win
    ties, so the named patterns and their closed forms survive where they are optimal)."""
    orders, makespan = search(p, m, costs, limit, input_grad_frees)
    if first is not None:
        own = round(evaluate_orders(first, costs, p), 9)
        if own <= makespan + 1e-9:
            return first, own
    return orders, makespan


@lru_cache(maxsize=64)
def search(p: int, m: int, costs: Costs, limit: float, input_grad_frees: float = 0.0) -> tuple[tuple, float]:
    """(orders, makespan) of the fastest split-backward order found under ``limit``.

    Cached (``auto`` asks for zb, zb-h1 and zb-h2 at one limit: one search). Candidates: the greedy list scheduler under several warm-up depths and W policies (``zb_greedy``), the published
    round-based heuristic under all 8 of its flag combinations and both readings of its warm-up rule (``zb_heuristic``), the delayed-W patterns
    that fit; then adjacent swaps on the winner while the simulated makespan improves (small shapes).
    """
    best_orders_, best_key = None, (INF, INF)
    families = _depth_families(p, m, costs, limit)
    if p * m > _LARGE:
        del families["round-trip+1"]
    if input_grad_frees == 0.0:  # held >= forwards - I's, so a depth above the limit changes nothing
        cap = max(1, math.floor(limit + 1e-9))
        families = {name: tuple(min(d, cap) for d in depth) for name, depth in families.items()}
    fit_options = (False,) if p * m > _LARGE else (False, True)
    for ahead in dict.fromkeys(families.values()):  # distinct depths only, in family order
        for w_fit in fit_options:
            policy = GreedyPolicy(
                ahead=ahead, memory_limit=limit, input_grad_frees=input_grad_frees, w_only_if_it_fits=w_fit
            )
            result = run_greedy(p, m, costs, policy)
            key = (round(result.makespan, 9), result.peak_memory)
            if key < best_key:
                best_orders_, best_key = result.orders, key
    fits = _fits_orders(limit, input_grad_frees)
    # Below p M_B the published heuristic waits in lock-step (at p=32, m=256 it is 6-7x slower than the greedy
    # on every grid profile): large shapes skip it there, small ones still try it.
    published = () if p * m > _LARGE and limit < p else distinct_runs(p, m, costs, limit)
    for depths, prioritize_b, no_bubble_greedy in published:
        run = heuristic_orders(  # a run that cannot end strictly below the best stops early (None)
            p, m, costs, limit, input_grad_frees, depths, prioritize_b, no_bubble_greedy, stop_above=best_key[0]
        )
        if run is None:
            continue
        orders, makespan, peak = run
        makespan = round(makespan, 9)
        if makespan < best_key[0] and peak <= limit + 1e-9:
            best_orders_, best_key = orders, (makespan, INF)
    for orders in _pattern_candidates(p, m, limit):  # peaks counted with I freeing nothing: an upper bound
        makespan = round(evaluate_orders(orders, costs, p), 9)
        if makespan < best_key[0]:
            best_orders_, best_key = orders, (makespan, INF)
    if p * m * 200 <= SEARCH_BUDGET:
        rows, makespan = adjacent_swaps(
            best_orders_, lambda rows: evaluate_orders(rows, costs, p), can_swap=_can_swap, fits=fits,
            budget=SEARCH_BUDGET, best=best_key[0],
        )
        if makespan < best_key[0] - 1e-9:
            best_orders_, best_key = tuple(rows), (round(makespan, 9), INF)
    return best_orders_, best_key[0]


def check_limit(name: str, limit: float, input_grad_frees: float) -> None:
    if limit < 1.0:
        raise ValueError(
            f"{name} needs memory_limit >= 1 M_B (every rank holds at least one micro-batch's activations), "
            f"got {limit:g}"
        )
    if not 0.0 <= input_grad_frees <= 1.0:
        raise ValueError(f"input_grad_frees must be within [0, 1], got {input_grad_frees}")


@register("zb", "zerobubble")
def zb(
    *,
    num_ranks: int,
    num_microbatches: int,
    costs: Costs,
    memory_limit: float | None,
    input_grad_frees: float = 0.0,
) -> Schedule:
    """The fastest split-backward schedule found under ``memory_limit`` (default p M_B) for ``costs``."""
    p, m = num_ranks, num_microbatches
    limit = float(p if memory_limit is None else memory_limit)
    check_limit("zb", limit, input_grad_frees)
    costs.check_stages(p)
    orders, _ = best_orders(p, m, costs, limit, input_grad_frees)
    return Schedule(to_actions(orders), num_stages=p, num_microbatches=m, stage_to_rank=loop_placement(p), name="zb")


zb.placement_of = loop_placement  # for auto's bound and order (generators/bounds.py)
zb.peak_of = lambda p, m: p
