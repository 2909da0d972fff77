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
    """Schedule F, I and W of every micro-batch on ``num_ranks`` ranks (stage r on rank r) greedily."""
    p, m = num_ranks, num_microbatches
    cf, ci, cw = stage_costs(costs, p)
    comm, g, limit = float(costs.comm), policy.input_grad_frees, policy.memory_limit + _EPS
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
    push, pop = heapq.heappush, heapq.heappop  # local names: this loop runs once per action and wait
    ahead, w_fit, kind_f, kind_i, kind_w = policy.ahead, policy.w_only_if_it_fits, Kind.F, Kind.I, Kind.W

    def wake(rank: int, at: float) -> None:
        if waiting[rank]:
            push(heap, (max(at, free[rank]), rank, version[rank]))

    while heap:
        t, r, ver = pop(heap)
        if ver != version[r]:
            continue
        k_i, k_f = ni[r], nf[r]
        i_arrival = INF
        if k_i < k_f:
            i_arrival = f_end[r][k_i]
            if r < last:
                i_arrival = max(i_arrival, i_end[r + 1][k_i] + comm)
        held = k_f - g * k_i - (1.0 - g) * nw[r]
        f_arrival = INF
        if k_f < m and k_f - k_i < ahead[r] and held + 1.0 <= limit:
            f_arrival = 0.0 if r == 0 else f_end[r - 1][k_f] + comm
        if i_arrival <= t:
            kind, start, mb = kind_i, max(free[r], i_arrival), k_i
        elif f_arrival <= t:
            kind, start, mb = kind_f, max(free[r], f_arrival), k_f
        elif nw[r] < k_i and (not w_fit or free[r] + cw[r] <= min(i_arrival, f_arrival) + _EPS):
            kind, start, mb = kind_w, free[r], nw[r]  # its I ran on this rank, so W can start at once
        else:
            waiting[r] = True
            nxt = min(i_arrival, f_arrival)
            if nxt < INF:
                push(heap, (nxt, r, ver))
            continue
        waiting[r] = False
        version[r] += 1
        if kind is kind_f:
            end = start + cf[r]
            f_end[r][mb] = end
            nf[r] += 1
            held += 1.0
            if held > peak[r]:
                peak[r] = held
            if r < last:
                wake(r + 1, end + comm)
        elif kind is kind_i:
            end = start + ci[r]
            i_end[r][mb] = end
            ni[r] += 1
            if r > 0:
                wake(r - 1, end + comm)
        else:
            end = start + cw[r]
            nw[r] += 1
        orders[r].append((kind, mb))
        free[r] = end
        if end > makespan:
            makespan = end
        if nw[r] < m:
            push(heap, (end, r, version[r]))
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
    progress = True
    while progress:
        progress = False
        for r in range(p):
            row, at, t = orders[r], pos[r], free[r]
            f_prev = f_end[r - 1] if r > 0 else None
            i_next = i_end[r + 1] if r < p - 1 else None
            f_own, i_own = f_end[r], i_end[r]
            cf, ci, cw = cost_f[r], cost_i[r], cost_w[r]
            while at < len(row):
                kind, mb = row[at]
                if kind is Kind.F:
                    ready = 0.0 if f_prev is None else f_prev[mb] + comm
                    if ready == INF:
                        break
                    t = max(t, ready) + cf
                    f_own[mb] = t
                elif kind is Kind.I:
                    ready = f_own[mb] if i_next is None else max(f_own[mb], i_next[mb] + comm)
                    if ready == INF:
                        break
                    t = max(t, ready) + ci
                    i_own[mb] = t
                elif kind is Kind.W:
                    if i_own[mb] == INF:
                        break
                    t = max(t, i_own[mb]) + cw
                else:
                    raise ValueError(f"evaluate_orders handles F, I and W only, got {kind}")
                at += 1
            if at != pos[r]:
                pos[r], free[r], progress = at, t, True
    if any(pos[r] < len(orders[r]) for r in range(p)):
        return INF
    return max(free)
