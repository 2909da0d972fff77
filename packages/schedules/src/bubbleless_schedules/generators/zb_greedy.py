"""Greedy list scheduling of split-backward pipelines (one stage per rank): the engine behind ``zb``.

The zero-bubble paper's automatic scheduler, in our own words: every rank, whenever it is free, runs the
input-gradient backward I if its gradient has arrived (I is on the critical path), else a forward F if
its input has arrived and both its warm-up depth and its memory allow, else a pending weight-gradient
backward W (W is off the critical path and fills what would be a bubble), else it waits. The warm-up
depth per rank and the W policy are the knobs; ``zb`` tries several and keeps the fastest.

Times are computed with exactly the simulator's rule (an action starts when its rank is free and its
inputs have arrived, ``comm`` later from another rank), so the makespan this module reports is the one
``simulate`` gives for the returned order; the module exists because it is an order of magnitude faster
than building a ``Schedule`` and simulating it for every candidate.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..action import Action, Kind
from ..costs import Costs

INF = float("inf")
_EPS = 1e-9


@dataclass(frozen=True, kw_only=True)
class GreedyPolicy:
    """How the greedy scheduler trades memory for idle time."""

    ahead: tuple[int, ...]
    """Per rank: the most micro-batches whose forward is done and whose I is not (the warm-up depth)."""
    memory_limit: float
    """Per rank: activations (in M_B) a forward may never push the rank above."""
    input_grad_frees: float = 0.0
    """Fraction of a micro-batch's activations that I frees (W frees the rest)."""
    w_only_if_it_fits: bool = False
    """False: fill any idle moment with a pending W. True: run W only when it ends before the next
    known arrival of an I or F input, so W never delays the critical path (W's left over run at the end)."""


Order = list[tuple[Kind, int]]
"""One rank's actions as (kind, micro-batch) pairs; its stage is the rank. Cheaper than ``Action``s
while candidates are compared; ``to_actions`` converts the winner."""


@dataclass(frozen=True)
class GreedyResult:
    orders: tuple[Order, ...]
    makespan: float
    peak_memory: float


def to_actions(orders) -> list[list[Action]]:
    return [[Action(rank, kind, mb) for kind, mb in row] for rank, row in enumerate(orders)]


def stage_costs(costs: Costs, num_stages: int) -> tuple[list[float], list[float], list[float]]:
    """Per-stage F, I, W costs for a one-stage-per-rank pipeline."""
    costs.check_stages(num_stages)
    return tuple([costs.of(kind, s, 1.0) for s in range(num_stages)] for kind in (Kind.F, Kind.I, Kind.W))


def run_greedy(num_ranks: int, num_microbatches: int, costs: Costs, policy: GreedyPolicy) -> GreedyResult:
    """Schedule F, I and W of every micro-batch on ``num_ranks`` ranks (stage r on rank r) greedily.

    Hot (``zb`` runs it up to 10 times per search; 100,000 heap events at p=32, m=256): locals only, no
    calls but the heap's, ``a if a > b else b`` for ``max`` (the same value, without the call)."""
    p, m = num_ranks, num_microbatches
    cf, ci, cw = stage_costs(costs, p)
    comm, g, limit = float(costs.comm), policy.input_grad_frees, policy.memory_limit + _EPS
    keep = 1.0 - g  # what W frees
    last = p - 1
    f_end = [[INF] * m for _ in range(p)]
    i_end = [[INF] * m for _ in range(p)]
    nf, ni, nw = [0] * p, [0] * p, [0] * p
    free = [0.0] * p
    version = [0] * p
    waiting = [False] * p
    peak = [0.0] * p
    orders: list[Order] = [[] for _ in range(p)]
    heap = [(0.0, r, 0) for r in range(p)]
    makespan = 0.0
    push, pop = heapq.heappush, heapq.heappop
    ahead, w_fit, kind_f, kind_i, kind_w = policy.ahead, policy.w_only_if_it_fits, Kind.F, Kind.I, Kind.W

    while heap:
        t, r, ver = pop(heap)
        if ver != version[r]:
            continue
        k_i, k_f, k_w = ni[r], nf[r], nw[r]
        i_arrival = INF
        if k_i < k_f:
            i_arrival = f_end[r][k_i]
            if r < last:
                after = i_end[r + 1][k_i] + comm
                if after > i_arrival:
                    i_arrival = after
        held = k_f - g * k_i - keep * k_w
        f_arrival = INF
        if k_f < m and k_f - k_i < ahead[r] and held + 1.0 <= limit:
            f_arrival = 0.0 if r == 0 else f_end[r - 1][k_f] + comm
        at = free[r]
        if i_arrival <= t:
            end = (i_arrival if i_arrival > at else at) + ci[r]
            i_end[r][k_i] = end
            ni[r] = k_i + 1
            orders[r].append((kind_i, k_i))
            if r > 0 and waiting[r - 1]:  # the gradient reaches rank r-1 comm later
                wake = end + comm
                push(heap, (wake if wake > free[r - 1] else free[r - 1], r - 1, version[r - 1]))
        elif f_arrival <= t:
            end = (f_arrival if f_arrival > at else at) + cf[r]
            f_end[r][k_f] = end
            nf[r] = k_f + 1
            held += 1.0
            if held > peak[r]:
                peak[r] = held
            orders[r].append((kind_f, k_f))
            if r < last and waiting[r + 1]:  # the activation reaches rank r+1 comm later
                wake = end + comm
                push(heap, (wake if wake > free[r + 1] else free[r + 1], r + 1, version[r + 1]))
        elif k_w < k_i and (not w_fit or at + cw[r] <= (i_arrival if i_arrival < f_arrival else f_arrival) + _EPS):
            end = at + cw[r]  # its I ran on this rank, so W can start at once
            nw[r] = k_w = k_w + 1
            orders[r].append((kind_w, k_w - 1))
        else:
            waiting[r] = True
            nxt = f_arrival if f_arrival < i_arrival else i_arrival
            if nxt < INF:
                push(heap, (nxt, r, ver))
            continue
        waiting[r] = False
        version[r] = ver = ver + 1
        free[r] = end
        if end > makespan:
            makespan = end
        if nw[r] < m:
            push(heap, (end, r, ver))
    if any(n < m for n in nw):  # pragma: no cover - an internal invariant, not user input
        raise AssertionError(f"greedy scheduler stalled with W counts {nw} of {m}")
    return GreedyResult(tuple(orders), makespan, max(round(x, 9) for x in peak))


def evaluate_orders(orders, costs: Costs, num_ranks: int) -> float:
    """Makespan of fixed per-rank ``Order``s of a one-stage-per-rank pipeline (the simulator's rule, fast).

    Returns ``INF`` when the orders deadlock.
    """
    p = num_ranks
    m = 1 + max((mb for row in orders for _, mb in row), default=0)
    cost_f, cost_i, cost_w = stage_costs(costs, p)
    comm = float(costs.comm)
    f_end = [[INF] * m for _ in range(p)]
    i_end = [[INF] * m for _ in range(p)]
    pos, free = [0] * p, [0.0] * p
    kind_f, kind_i, kind_w = Kind.F, Kind.I, Kind.W
    progress = True
    while progress:
        progress = False
        for r in range(p):
            row, at, t = orders[r], pos[r], free[r]
            first, last = r == 0, r == p - 1
            f_prev = f_end[r - 1]  # unused on rank 0 (its forwards need nothing)
            i_next = i_end[r + 1] if not last else None
            f_own, i_own = f_end[r], i_end[r]
            cf, ci, cw = cost_f[r], cost_i[r], cost_w[r]
            length = len(row)
            while at < length:
                kind, mb = row[at]
                if kind is kind_f:
                    if first:
                        ready = 0.0
                    else:
                        ready = f_prev[mb] + comm
                        if ready == INF:
                            break
                    t = (ready if ready > t else t) + cf
                    f_own[mb] = t
                elif kind is kind_i:
                    ready = f_own[mb]
                    if not last:
                        after = i_next[mb] + comm
                        if after > ready:
                            ready = after
                    if ready == INF:
                        break
                    t = (ready if ready > t else t) + ci
                    i_own[mb] = t
                elif kind is kind_w:
                    ready = i_own[mb]
                    if ready == INF:
                        break
                    t = (ready if ready > t else t) + cw
                else:
                    raise ValueError(f"evaluate_orders handles F, I and W only, got {kind}")
                at += 1
            if at != pos[r]:
                pos[r], free[r], progress = at, t, True
    if any(pos[r] < len(orders[r]) for r in range(p)):
        return INF
    return max(free)
