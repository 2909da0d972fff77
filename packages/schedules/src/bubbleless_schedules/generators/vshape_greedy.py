"""A fast, cost-aware list scheduler for V placement (rank i holds stages i and 2p-1-i).

The V generators (``zbv``, ``v-half``, ``v-min``) search a handful of priority rules and keep the
fastest order; each try must cost far less than the shared simulator (a whole search at p=32, m=256
stays well under a second), so this module simulates while it schedules: a rank that falls free picks,
among the actions whose inputs have arrived, the first one its ``Policy`` prefers, and the times it
records are the ones ``simulate`` will find for the same order.

Deadlock under a memory cap is ruled out by reservation: a rank admits a new micro-batch into its
first chunk only if one activation of room stays free afterwards. Take the oldest unfinished
micro-batch: forwards run in micro-batch order per stage, so on a rank it has not passed, every
activation held belongs to a younger micro-batch and was made by a first-chunk forward (a younger one
cannot overtake it into the second chunk), and the reserved room takes its next forward; its backward
needs no memory. So it always finishes, and by induction every micro-batch does.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..action import Action, Kind
from ..costs import Costs
from .vshape_state import ListState


@dataclass(frozen=True, kw_only=True)
class Policy:
    """How a free rank chooses among ready actions."""

    order: tuple[str, ...] = ("I", "F1", "F0", "W")
    """Preference among the input-gradient backward (``I``), the forward of the rank's second
    chunk (``F1``, on the way back up the V), the forward of its first chunk (``F0``, admitting a
    micro-batch) and a deferred weight-gradient (``W``)."""
    w_first_when_held: float = float("inf")
    """Run a pending W before any forward once the rank holds at least this many chunk activations
    (keeps memory low for the tail; ``inf`` = never)."""
    fill_w: bool = True
    """While waiting for its script's next action, a rank runs a pending W (False: follow the script
    exactly, as a fixed published order does)."""
    reserve_all: bool = False
    """Admit a micro-batch into the first chunk only with room for the second-chunk forward of every
    admitted micro-batch (True), or with room for just one more activation (False, which is enough to
    rule out deadlock and lets a rank fill its warm-up, as ZB-V does)."""
    patience: float = 0.0
    """A rank with only a W (or an admission) ready waits for an I or F1 that arrives within this
    fraction of the W's cost, instead of starting the W and delaying the critical path."""
    lookahead: int = 1
    """While its script's next action is not ready, a rank may run one of the next ``lookahead - 1``
    script actions that is (never past an earlier one of the same token, and a forward only within the
    memory cap): the controllable-memory paper's reordering of a repeated block under real costs."""
    lookahead_cap: float | None = None
    """Chunk activations a forward run under ``lookahead`` may not exceed (None: the memory cap); the
    script's own peak keeps the reordered block's lifespans."""
    reserve: bool = True
    """Keep the room of one activation when admitting a micro-batch (the rule that rules out deadlock;
    see the module). False admits up to the cap, as an optimal cool-down does; a try may then stall,
    and returns None."""


@dataclass(frozen=True)
class GreedyResult:
    actions: tuple[tuple[Action, ...], ...]
    makespan: float
    span_sum: float
    """Sum over ranks of (last end - first start): smaller means less idle inside the ranks' spans."""
    peak_chunks: float
    admitted: tuple[float, ...] = ()
    """End of each micro-batch's first forward (stage 0), in micro-batch order: the steady state's pace
    (``vshape_ranked`` reads a short run's period off it to rank candidates for large shapes)."""
    times: list | None = field(default=None, compare=False, repr=False)
    """Each action's (start, end) as a fixed order runs, where the timer recorded them (``vshape_fixed``): the
    cool-down resumes from them (``vshape_resume``) instead of timing the order again."""


def _stage_rank(stage: int, p: int) -> int:
    return stage if stage < p else 2 * p - 1 - stage


@lru_cache(maxsize=4)
def action_table(num_stages: int, num_microbatches: int) -> dict[Kind, tuple[tuple[Action, ...], ...]]:
    """``table[kind][stage][microbatch]``: one shared (frozen) ``Action`` per pass, so the tries of a search
    look their actions up instead of building 6pm of them each (a fifth of a try's time at p=32, m=256)."""
    return {
        kind: tuple(tuple(Action(s, kind, k) for k in range(num_microbatches)) for s in range(num_stages))
        for kind in (Kind.F, Kind.I, Kind.W)
    }


def _w_first(order: tuple[str, ...]) -> tuple[str, ...]:
    """``order`` with I and then W ahead of the forwards (``Policy.w_first_when_held``)."""
    return ("I", "W") + tuple(k for k in order if k not in ("I", "W"))


def v_list_schedule(
    p: int,
    m: int,
    costs: Costs,
    cap_chunks: float,
    policy: Policy,
    input_grad_frees: float = 0.0,
    scripts: Sequence[Sequence[str]] | None = None,
    resume: ListState | None = None,
) -> GreedyResult | None:
    """Schedule ``m`` micro-batches on ``p`` V-placed ranks, holding at most ``cap_chunks`` chunk
    activations (one chunk = 1/2 M_B) per rank. Raises ValueError if the cap is below 2 chunks.

    ``scripts`` (optional, one per rank) fix the start of each rank's order as tokens ``F0``, ``F1``,
    ``I0``, ``I1``, ``W`` (next micro-batch of that kind and chunk; ``W`` the oldest pending, ``W0`` /
    ``W1`` the oldest pending of that chunk, as a building block names it); a rank
    waits for its next token (running a pending W meanwhile, if it has one), and follows ``policy``
    once its script is done. A script must respect
    the memory cap itself. Returns None if the scripts lead to a deadlock.

    ``resume``: the run's state at some time, the same scripts' remaining tokens in it (``vshape_resume``);
    the run goes on from there instead of from time 0."""
    if cap_chunks < 2 - 1e-9:
        raise ValueError(
            f"a V schedule needs room for both chunks of one micro-batch (memory_limit >= 1 M_B); got "
            f"{cap_chunks / 2:g} M_B"
        )
    n = 2 * p
    f_cost = [costs.of(Kind.F, s, 2) for s in range(n)]
    i_cost = [costs.of(Kind.I, s, 2) for s in range(n)]
    w_cost = [costs.of(Kind.W, s, 2) for s in range(n)]
    comm = float(costs.comm)
    state = ListState.start(p, m, scripts) if resume is None else resume
    f_done, g_done, next_f, next_i = state.f_done, state.g_done, state.next_f, state.next_i
    held, peak, admitted_not_up = state.held, state.peak, state.admitted_not_up
    pending_w, pending_of, free_at, first_start = state.pending_w, state.pending_of, state.free_at, state.first_start
    out, remaining, events, scripts = state.out, state.remaining, state.events, state.scripts
    eps = 1e-12
    inf = float("inf")
    g = input_grad_frees

    last = n - 1
    rank_of = [_stage_rank(s, p) for s in range(n)]
    # the delay on the edge from stage s to its neighbour below (s-1) or above (s+1): comm between ranks
    comm_down = [comm if s > 0 and rank_of[s - 1] != rank_of[s] else 0.0 for s in range(n)]
    comm_up = [comm if s < last and rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n)]
    push, pop = heapq.heappush, heapq.heappop
    room = cap_chunks + 1e-9
    plain_order, w_first_order = policy.order, _w_first(policy.order)
    w_first_at = policy.w_first_when_held - 1e-9
    patience, reserve_all, fill_w = policy.patience, policy.reserve_all, policy.fill_w
    reserve_one = 1 if policy.reserve else 0
    lookahead = max(1, policy.lookahead)
    room_ahead = room if policy.lookahead_cap is None else min(room, policy.lookahead_cap + 1e-9)
    table = action_table(n, m)
    act_f, act_i, act_w = table[Kind.F], table[Kind.I], table[Kind.W]

    # each rank's two stages and everything the loop reads for them, bound once (s0 = r < last, so
    # stage s0 always has a stage above it; s1 = last - r >= p > 0 always has one below)
    per_rank = [
        (
            r, last - r, f_done[r], g_done[r + 1], f_done[r - 1] if r > 0 else None, f_done[last - r],
            g_done[last - r + 1] if r > 0 else None, f_done[last - r - 1], comm_up[r], comm_up[last - r],
            comm_down[r], comm_down[last - r], pending_w[r], pending_of[r], scripts[r], out[r].append,
        )
        for r in range(p)
    ]
    # The loop below inlines, for speed, when each rank's next actions become ready: the forward of
    # stage s when stage s-1's output for that micro-batch has arrived; the input-gradient backward when
    # its own forward is done and stage s+1's gradient has arrived (an event's time is its end plus the
    # edge's comm). A rank r always acts for its own stages, r (first chunk) and 2p-1-r (second chunk).
    makespan = state.makespan
    while remaining:
        if not events:
            if any(scripts) or not reserve_one:
                return None
            raise AssertionError("V list scheduler stalled; the reservation rule should prevent this")
        now, r = pop(events)
        if now < free_at[r] - eps:
            continue
        (s0, s1, f0_row, g0_above, f0_below, f1_row, g1_above, f1_below, up0, up1, down0, down1,
         waiting, waiting_of, script, emit) = per_rank[r]
        # candidate -> when it can start; F0/I0 act on stage s0, F1/I1 on s1, "I" (the earlier I) on i_stage
        cand: dict[str, float] = {}
        i_stage = -1
        k = next_i[s1]
        if k < m:
            t = f1_row[k]
            if t >= 0:
                if g1_above is None:  # s1 is the last stage: its gradient starts there
                    cand["I1"] = t
                    cand["I"], i_stage = t, s1
                else:
                    arrived = g1_above[k]
                    if arrived >= 0:
                        arrived += up1
                        if arrived > t:
                            t = arrived
                        cand["I1"] = t
                        cand["I"], i_stage = t, s1
        k = next_i[s0]
        if k < m:
            t = f0_row[k]
            if t >= 0:
                arrived = g0_above[k]
                if arrived >= 0:
                    arrived += up0
                    if arrived > t:
                        t = arrived
                    cand["I0"] = t
                    if i_stage < 0 or t < cand["I"] - eps:
                        cand["I"], i_stage = t, s0
        held_r = held[r]
        k = next_f[s1]
        if k < m:
            t = f1_below[k]
            if t >= 0 and (script or held_r + 1 <= room):
                cand["F1"] = t + down1
        k = next_f[s0]
        reserve = 1 + admitted_not_up[r] if reserve_all else reserve_one
        if k < m and (script or held_r + 1 + reserve <= room):
            if f0_below is None:
                cand["F0"] = 0.0
            else:
                t = f0_below[k]
                if t >= 0:
                    cand["F0"] = t + down0
        if waiting:
            cand["W"] = now
            if waiting_of[0]:
                cand["W0"] = now
            if waiting_of[1]:
                cand["W1"] = now
        horizon = now + eps
        get = cand.get  # a key is ready when get(key, inf) <= horizon ("W" whenever it is a key)
        order = w_first_order if "W" in cand and held_r >= w_first_at else plain_order
        if script:
            if script[0][0] == "W" and script[0] not in cand:
                script.popleft()  # its W was already run to fill a gap
                push(events, (now, r))
                continue
            head = script[0]
            choice = None
            head_ready = get(head, inf) <= horizon
            if head_ready and (lookahead == 1 or head[0] != "F" or held_r + 1 <= room_ahead):
                choice = script.popleft()
            elif lookahead > 1:
                seen = {head}
                for j in range(1, min(lookahead, len(script))):
                    token = script[j]
                    if token in seen:
                        continue
                    seen.add(token)
                    if get(token, inf) <= horizon and (token[0] != "F" or held_r + 1 <= room_ahead):
                        choice = token
                        del script[j]
                        break
            blocked = head_ready and choice is None  # a forward held back by the memory cap
            if choice is None and "W" in cand and (fill_w or blocked):
                choice = "W"  # fill the wait for the script's next action with a deferred W
            elif choice is None:
                if head in cand and cand[head] > now + eps:
                    push(events, (cand[head], r))
                continue  # otherwise a finishing neighbour wakes this rank
            if choice in ("I0", "I1"):
                cand["I"], i_stage, choice = cand[choice], s0 if choice == "I0" else s1, "I"
        else:
            choice = None
            for key in order:
                if get(key, inf) <= horizon:
                    choice = key
                    break
        if patience > 0 and choice in ("W", "F0") and not script:
            w_len = w_cost[waiting[0][0]] if waiting else f_cost[s0]
            # wait only for an arrival the order would run first: under the W-first order an F1 arriving
            # soon would not be chosen over the W either, and the wait would only idle the rank
            ahead = order[:order.index(choice)] if choice in order else order
            soon = [t for key, t in cand.items() if key in ("I", "F1") and key in ahead and t > now + eps]
            if soon and min(soon) - now < patience * w_len:
                push(events, (min(soon), r))
                continue
        if choice is None:
            future = [t for t in cand.values() if t > now + eps]
            if future:
                push(events, (min(future), r))
            continue
        if choice == "W":
            s, k = waiting.popleft()
            waiting_of[s != s0] -= 1
            end = now + w_cost[s]
            held[r] = held_r - (1 - g)
            emit(act_w[s][k])
        elif choice in ("W0", "W1"):
            s = s0 if choice == "W0" else s1
            oldest = next(item for item in waiting if item[0] == s)
            waiting.remove(oldest)
            waiting_of[s != s0] -= 1
            k = oldest[1]
            end = now + w_cost[s]
            held[r] = held_r - (1 - g)
            emit(act_w[s][k])
        elif choice == "I":
            s = i_stage
            k = next_i[s]
            next_i[s] += 1
            end = now + i_cost[s]
            g_done[s][k] = end
            held[r] = held_r - g
            waiting.append((s, k))
            waiting_of[s != s0] += 1
            emit(act_i[s][k])
            if s > 0:
                push(events, (end + comm_down[s], rank_of[s - 1]))
        else:
            s = s0 if choice == "F0" else s1
            k = next_f[s]
            next_f[s] += 1
            end = now + f_cost[s]
            f_done[s][k] = end
            held_r += 1
            held[r] = held_r
            admitted_not_up[r] += 1 if choice == "F0" else -1
            if held_r > peak[r]:
                peak[r] = held_r
            emit(act_f[s][k])
            if s < last:
                push(events, (end + comm_up[s], rank_of[s + 1]))
        free_at[r] = end
        if first_start[r] < 0:
            first_start[r] = now
        if end > makespan:
            makespan = end
        remaining -= 1
        push(events, (end, r))
    span_sum = sum(free_at[r] - first_start[r] for r in range(p))
    return GreedyResult(tuple(tuple(a) for a in out), makespan, span_sum, max(peak), tuple(f_done[0]))
