"""Resuming a list-scheduled run part-way through a fixed order: what lets the cool-down step
(``vshape_cooldown.recooled``) re-schedule only the end of an order instead of the whole of it.

A cool-down try runs each rank's order up to a cut as a script, then lets the list scheduler finish it. Under a
policy that follows a script exactly (no W's filling waits, no lookahead), every action that starts before the
first rank runs out of script, at time ``cut``, is the order's own action at its fixed-order time: nothing before
``cut`` can depend on an action the list scheduler chose. So the try's state at ``cut`` is read off the order's
fixed-order timing (``vshape_fixed.time_fixed_order``, a third of a list-scheduled run) and the list scheduler
goes on from there: at p=32 m=256 the cut comes after most of the run. Every action started before ``cut`` is
done, with its end; every wake-up at or after ``cut`` that those actions cause is queued (an arrival, a rank
falling free), and later ones follow from the run, as they would have. tests/test_sched_v_resume.py compares
resumed tries with tries from time 0.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from ..action import Action, Kind
from ..costs import Costs
from .vshape_fixed import time_fixed_order
from .vshape_greedy import GreedyResult, Policy
from .vshape_state import ListState


def tokens_of_rows(p: int, rows) -> list[list[str]]:
    """Each rank's actions as script tokens, every W naming its chunk (``W0`` / ``W1``)."""
    token = {(kind, chunk): f"{kind.value}{chunk}" for kind in Kind for chunk in (0, 1)}
    return [[token[a.kind, 0 if a.stage < p else 1] for a in row] for row in rows]


def follows_scripts_exactly(policy: Policy) -> bool:
    """Whether a rank with script left runs exactly its script's next token (no W fills a wait, no lookahead)."""
    return not policy.fill_w and policy.lookahead <= 1


def fixed_timing(
    p: int, m: int, costs: Costs, base: GreedyResult, input_grad_frees: float
) -> list[list[tuple[float, float]]] | None:
    """Each action's (start, end) when ``base``'s rows run as a fixed order (the ones recorded with it, if any);
    None when the fixed-order timer would run another order (a chunk's W's out of their I's order) or cannot."""
    if base.times is not None:
        return base.times
    rows = base.actions
    times: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    timed = time_fixed_order(p, m, costs, tokens_of_rows(p, rows), input_grad_frees, times=times)
    if timed is None or timed.actions != tuple(map(tuple, rows)):
        return None
    return times


def state_at_cut(
    p: int, m: int, costs: Costs, rows: Sequence[Sequence[Action]], times, scripts: Sequence[Sequence[str]],
    input_grad_frees: float,
) -> ListState | None:
    """The state of ``v_list_schedule`` run with ``scripts`` (each a prefix of ``rows``' tokens) at the time the
    first rank's script ends; None when that is time 0 (nothing to skip)."""
    cut = min(times[r][len(script) - 1][1] if script else 0.0 for r, script in enumerate(scripts))
    if cut <= 0.0:
        return None
    n, last, g = 2 * p, 2 * p - 1, input_grad_frees
    comm = float(costs.comm)
    rank_of = [s if s < p else last - s for s in range(n)]
    comm_down = [comm if s > 0 and rank_of[s - 1] != rank_of[s] else 0.0 for s in range(n)]
    comm_up = [comm if s < last and rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n)]
    state = ListState.start(p, m)
    f_done, g_done, next_f, next_i = state.f_done, state.g_done, state.next_f, state.next_i
    events: list[tuple[float, int]] = []
    for r, script in enumerate(scripts):
        held, peak, done = 0.0, 0.0, 0
        waiting, waiting_of, out = state.pending_w[r], state.pending_of[r], state.out[r]
        for action, (start, end) in zip(rows[r][: len(script)], times[r], strict=False):
            if start >= cut:
                break
            s, k, kind = action.stage, action.microbatch, action.kind
            if kind is Kind.F:
                f_done[s][k] = end
                next_f[s] += 1
                held += 1
                peak = held if held > peak else peak
                state.admitted_not_up[r] += 1 if s == r else -1
                if s < last and end + comm_up[s] >= cut:
                    events.append((end + comm_up[s], rank_of[s + 1]))
            elif kind is Kind.I:
                g_done[s][k] = end
                next_i[s] += 1
                held -= g
                waiting.append((s, k))
                waiting_of[s != r] += 1
                if s > 0 and end + comm_down[s] >= cut:
                    events.append((end + comm_down[s], rank_of[s - 1]))
            else:
                waiting.remove((s, k))
                waiting_of[s != r] -= 1
                held -= 1 - g
            out.append(action)
            if done == 0:
                state.first_start[r] = start
            state.free_at[r] = end
            state.makespan = max(state.makespan, end)
            done += 1
        state.held[r], state.peak[r] = held, peak
        state.scripts[r] = deque(script[done:])
        state.remaining -= done
        events.append((state.free_at[r], r))
    heapq.heapify(events)
    state.events = events
    return state
