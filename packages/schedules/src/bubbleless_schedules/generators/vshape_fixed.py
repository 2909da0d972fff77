"""Timing a fixed V order fast: what the ranking of ``vshape_ranked._ranked_search`` needs of a candidate
that is run as is (a block's repeated order, the published greedy's), without the list scheduler's choices.

Each rank runs its script (``vshape_greedy`` tokens: ``F0`` ``F1`` ``I0`` ``I1``, ``W`` the oldest pending
weight-gradient, ``W0`` / ``W1`` the oldest of that chunk) in order; a pass starts when the rank is free and
its inputs have arrived, as ``simulate`` and ``v_list_schedule`` under ``vshape_candidates._FIXED_ORDER``
time it. A rank that waits for an input stops and is woken when a neighbour (the only ranks its inputs come
from under V placement) has moved on. About three times as fast as the list scheduler on the same order
(p=32, 64 micro-batches: 0.009 s against 0.028 s), which lets the ranking try the blocks' orders as they
are too, and the winner's full run takes 0.05 s instead of 0.13 at m=256.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..action import Kind
from ..costs import Costs
from .vshape_greedy import GreedyResult, action_table


def time_fixed_order(
    p: int, m: int, costs: Costs, scripts: Sequence[Sequence[str]], input_grad_frees: float = 0.0,
    times: list[list[tuple[float, float]]] | None = None,
) -> GreedyResult | None:
    """``scripts`` run as is on ``p`` V-placed ranks, timed (``v_list_schedule``'s result for the same
    scripts under ``vshape_candidates._FIXED_ORDER``); None if they deadlock or leave passes out.
    ``times`` (one empty list per rank): filled with each action's (start, end), for ``vshape_resume``."""
    n, last = 2 * p, 2 * p - 1
    f_cost = [costs.of(Kind.F, s, 2) for s in range(n)]
    i_cost = [costs.of(Kind.I, s, 2) for s in range(n)]
    w_cost = [costs.of(Kind.W, s, 2) for s in range(n)]
    comm = float(costs.comm)
    rank_of = [s if s < p else last - s for s in range(n)]
    # the delay on the edge from stage s to its neighbour below (s-1) or above (s+1): comm between ranks
    comm_down = [comm if s > 0 and rank_of[s - 1] != rank_of[s] else 0.0 for s in range(n)]
    comm_up = [comm if s < last and rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n)]
    g = input_grad_frees
    f_done = [[-1.0] * m for _ in range(n)]
    g_done = [[-1.0] * m for _ in range(n)]
    next_f, next_i = [0] * n, [0] * n
    pending = [deque() for _ in range(p)]
    pending_of = [[deque(), deque()] for _ in range(p)]
    free = [0.0] * p
    held, peak = [0.0] * p, [0.0] * p
    at = [0] * p
    first_start = [-1.0] * p
    table = action_table(n, m)
    act_f, act_i, act_w = table[Kind.F], table[Kind.I], table[Kind.W]
    out: list[list] = [[] for _ in range(p)]
    queued = [True] * p
    work = deque(range(p))
    while work:
        r = work.popleft()
        queued[r] = False
        script, stages = scripts[r], (r, last - r)
        t_free, i, row, held_r, peak_r = free[r], at[r], out[r], held[r], peak[r]
        waiting, waiting_of = pending[r], pending_of[r]
        begun, end = i, len(script)
        while i < end:
            token = script[i]
            kind = token[0]
            if kind == "W":
                if len(token) == 1:
                    if not waiting:
                        return None
                    s, k = waiting.popleft()
                    waiting_of[s != r].popleft()
                else:
                    queue = waiting_of[token[1] == "1"]
                    if not queue:
                        return None
                    s, k = queue.popleft()
                    waiting.remove((s, k))
                start = t_free
                t_free += w_cost[s]
                held_r -= 1 - g
                row.append(act_w[s][k])
            elif kind == "F":
                s = stages[token[1] == "1"]
                k = next_f[s]
                if k >= m:
                    return None
                start = t_free
                if s > 0:
                    arrived = f_done[s - 1][k]
                    if arrived < 0:
                        break
                    arrived += comm_down[s]
                    if arrived > start:
                        start = arrived
                next_f[s] = k + 1
                t_free = start + f_cost[s]
                f_done[s][k] = t_free
                held_r += 1
                if held_r > peak_r:
                    peak_r = held_r
                row.append(act_f[s][k])
            else:
                chunk = token[1] == "1"
                s = stages[chunk]
                k = next_i[s]
                if k >= m:
                    return None
                start = f_done[s][k]
                if start < 0:
                    break
                if s < last:
                    arrived = g_done[s + 1][k]
                    if arrived < 0:
                        break
                    arrived += comm_up[s]
                    if arrived > start:
                        start = arrived
                if t_free > start:
                    start = t_free
                next_i[s] = k + 1
                t_free = start + i_cost[s]
                g_done[s][k] = t_free
                held_r -= g
                waiting.append((s, k))
                waiting_of[chunk].append((s, k))
                row.append(act_i[s][k])
            if i == 0:
                first_start[r] = start
            if times is not None:
                times[r].append((start, t_free))
            i += 1
        free[r], at[r], held[r], peak[r] = t_free, i, held_r, peak_r
        if i > begun:
            for other in (r - 1, r + 1):
                if 0 <= other < p and not queued[other] and at[other] < len(scripts[other]):
                    queued[other] = True
                    work.append(other)
    if any(at[r] < len(scripts[r]) for r in range(p)) or any(x < m for x in next_i):
        return None
    span_sum = sum(free[r] - first_start[r] for r in range(p) if first_start[r] >= 0)
    return GreedyResult(tuple(tuple(row) for row in out), max(free), span_sum, max(peak), tuple(f_done[0]), times)
