"""The zero-bubble paper's round-based list scheduler (sail-sg ``zb.py``, paper §3): one candidate of ``zb``.

Written from its published description, in our own terms (``Order`` lists, per-stage costs). It places
one action at a time per stage, start = max(stage free, input + comm), keeping per stage its end time,
memory, idle time ("bubble") and F/I/W counters:

1. Warm-up: one F of micro-batch 0 everywhere; from the last stage down, as many F as fit before the
   stage's first gradient arrives (timed on an all-forward pipeline, capped by the memory limit), each
   stage at least one more than the next where memory allows; those F from the first stage up, then the
   first I from the last stage down.
2. One round per later micro-batch k: each stage places one F unless ``prioritize_b`` says the F would
   delay I(k) on a stage two or more F ahead of its successor; a stage never places fewer F than its
   successor asks for; F from the first stage up, then I(k) from the last stage down.
3. Before each F and I, W go in: while the action would break the memory limit; while a W fits before
   the action's input arrives; and one more into a partial gap when the gap is larger than the worst
   stage's idle minus this stage's (or always, with ``no_bubble_greedy``).
4. The W still owed run at the end.

``candidates`` runs all 8 flag combinations (the third, ``allow_bubble_before_first_b``, lets the warm-up
leave a gap shorter than F before the first I instead of running an F into it) under both readings of the
warm-up rule (``warmup_depths``), each distinct run once; ``zb`` keeps whichever the simulator times
fastest, beside its other candidates. Pure Python, lists of floats: about 0.02 s per run at p=32, m=256.
"""

from __future__ import annotations

import itertools

from ..action import Kind
from ..costs import Costs
from .zb_greedy import INF, Order, stage_costs

_EPS = 1e-9
FLAGS = tuple(itertools.product((True, False), repeat=3))
"""(allow_bubble_before_first_b, prioritize_b, no_bubble_greedy)."""

_F, _I, _W = 0, 1, 2
_KINDS = (Kind.F, Kind.I, Kind.W)


def warmup_depths(
    num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float, allow_bubble: bool, lower: bool,
) -> tuple[int, ...]:
    """Step 1's count per stage of the F before its first I (micro-batch 0's F included).

    "Stage i has strictly more F than stage i+1" is enforced by raising stage i where memory allows and,
    with ``lower``, by then lowering the stages below a capped one (not under the cap or 1F1B's p-s):
    equal counts make two stages wait on each other every round (p=32, m=256 under p: 2.4x 1F1B's
    makespan), yet help short pipelines (comm-heavy p=8, m=8: 38 against 44). ``zb`` tries both.
    """
    p, m = num_ranks, num_microbatches
    cf, ci, _ = stage_costs(costs, p)
    comm, last = float(costs.comm), p - 1
    cap = max(1, min(m, int(memory_limit + _EPS)))
    fwd = [[0.0] * cap for _ in range(p)]
    for s in range(p):
        prev, up = 0.0, fwd[s - 1] if s else None
        for k in range(cap):
            ready = up[k] + comm if up is not None else 0.0
            prev = (prev if prev > ready else ready) + cf[s]
            fwd[s][k] = prev
    want = [1] * p
    i_end = fwd[last][0] + ci[last]
    for s in range(p - 2, -1, -1):
        arrive = i_end + comm
        k, row = 1, fwd[s]
        while k < cap and (row[k] <= arrive + _EPS if allow_bubble else row[k - 1] < arrive - _EPS):
            k += 1
        want[s] = k
        i_end = max(row[k - 1], arrive) + ci[s]
    for s in range(p - 2, -1, -1):
        want[s] = max(want[s], min(want[s + 1] + 1, cap))
    for s in range(1, p if lower else 1):
        want[s] = max(min(cap, p - s), min(want[s], want[s - 1] - 1))
    return tuple(want)


def heuristic_orders(
    num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float, input_grad_frees: float,
    depths: tuple[int, ...], prioritize_b: bool, no_bubble_greedy: bool, *, stop_above: float = INF,
) -> tuple[tuple[Order, ...], float, float] | None:
    """One flag combination's (per-rank orders, makespan, peak memory), stage r on rank r.

    The makespan is the simulator's for these orders: each action is timed by the simulator's rule, and in
    the order the rank runs them, so no separate evaluation is needed. ``None`` once the run provably ends
    above ``stop_above`` (``_ends_above``): a caller that keeps only a strictly faster order skips the rest.

    Hot: ``zb`` runs this up to 16 times per search, 24,576 actions each at p=32, m=256. So F, I and W are
    placed by three small closures that take the input's arrival from their caller (``put_f``, ``put_i``,
    ``fill_w``), a W starts when the rank is free (its I ran on this rank, earlier), and only F can raise
    the peak; the arithmetic is the same, operation for operation, as the one-``put`` form this replaced."""
    p, m = num_ranks, num_microbatches
    cf, ci, cw = stage_costs(costs, p)
    comm, g, limit = float(costs.comm), input_grad_frees, memory_limit + _EPS
    d_i, d_w = -g, -(1.0 - g)  # memory each I and W adds (F adds 1.0)
    end = [0.0] * p
    mem = [0.0] * p
    peak = [0.0] * p
    bubble = [0.0] * p
    worst = 0.0  # the largest stage bubble so far
    nf, ni, nw = [0] * p, [0] * p, [0] * p
    f_done = [[0.0] * m for _ in range(p)]
    i_done = [[0.0] * m for _ in range(p)]
    rows: list[Order] = [[] for _ in range(p)]
    last = p - 1
    kind_f, kind_i, kind_w = _KINDS

    def put_f(s: int, ready: float) -> None:
        nonlocal worst
        free = end[s]
        start = ready if ready > free else free
        if start > free:
            idle = bubble[s] + (start - free)
            bubble[s] = idle
            if idle > worst:
                worst = idle
        finish = start + cf[s]
        end[s] = finish
        mb = nf[s]
        f_done[s][mb] = finish
        nf[s] = mb + 1
        held = mem[s] + 1.0
        mem[s] = held
        if held > peak[s]:
            peak[s] = held
        rows[s].append((kind_f, mb))

    def put_i(s: int, ready: float) -> None:
        nonlocal worst
        free = end[s]
        start = ready if ready > free else free
        if start > free:
            idle = bubble[s] + (start - free)
            bubble[s] = idle
            if idle > worst:
                worst = idle
        finish = start + ci[s]
        end[s] = finish
        mb = ni[s]
        i_done[s][mb] = finish
        ni[s] = mb + 1
        mem[s] += d_i  # never above the peak: only F adds memory
        rows[s].append((kind_i, mb))

    def fill_w(s: int, delta: float, ready: float) -> None:
        """The W placed before an action adding ``delta`` whose input arrives at ``ready`` (step 3)."""
        k, owed = nw[s], ni[s]
        if k >= owed:
            return
        free, held, w, row = end[s], mem[s], cw[s], rows[s]
        while k < owed and held + delta > limit:
            free, held, k = free + w, held + d_w, k + 1
            row.append((kind_w, k - 1))
        while k < owed and free + w <= ready + _EPS:
            free, held, k = free + w, held + d_w, k + 1
            row.append((kind_w, k - 1))
        if k < owed and free < ready - _EPS and (no_bubble_greedy or ready - free > worst - bubble[s] + _EPS):
            free, held, k = free + w, held + d_w, k + 1
            row.append((kind_w, k - 1))
        end[s], mem[s], nw[s] = free, held, k

    def i_arrival(s: int) -> float:
        own = f_done[s][ni[s]]
        if s == last:
            return own
        after = i_done[s + 1][ni[s]] + comm
        return after if after > own else own

    # 1. warm-up (a stage's first action opens its span: no idle counted before it)
    for s in range(p):
        finish = (f_done[s - 1][0] + comm if s else 0.0) + cf[s]
        end[s] = f_done[s][0] = finish
        nf[s], mem[s], peak[s] = 1, 1.0, 1.0
        rows[s].append((kind_f, 0))
    want = depths
    for s in range(p):
        for _ in range(min(want[s], want[s - 1] if s else m) - 1):
            put_f(s, f_done[s - 1][nf[s]] + comm if s else 0.0)
    for s in range(last, -1, -1):
        put_i(s, i_arrival(s))  # no I has run yet, so no W is owed

    # 2. one round per micro-batch
    required = [0] * p
    est = [0.0] * (p + 1)
    for k in range(1, m):
        for s in range(last, -1, -1):
            place = nf[s] < m
            if place and prioritize_b and s < last and nf[s] > k and nf[s] - nf[s + 1] >= 2:
                if end[s] + cf[s] > est[s + 1] + comm + _EPS:
                    place = False
            required[s] = nf[s] + place
            after_f = end[s] + (cf[s] if place else 0.0)
            from_next = est[s + 1] + comm if s < last else 0.0
            est[s] = (after_f if after_f > from_next else from_next) + ci[s]
        for s in range(p - 2, -1, -1):
            if required[s + 1] > required[s]:
                required[s] = required[s + 1]
        for s in range(p):
            upto = min(required[s], nf[s - 1] if s else m)
            while nf[s] < upto:
                held = mem[s] - (ni[s] - nw[s]) * (1.0 - g)  # what W cannot free
                if held + 1.0 > limit and nf[s] > k:
                    break
                ready = f_done[s - 1][nf[s]] + comm if s else 0.0
                fill_w(s, 1.0, ready)
                put_f(s, ready)
        for s in range(last, -1, -1):
            ready = i_arrival(s)
            fill_w(s, d_i, ready)
            put_i(s, ready)
        if k % 8 == 0 and _ends_above(stop_above, end, nf, ni, nw, cf, ci, cw, m):
            return None

    # 3. drain
    for s in range(p):
        free, w, row = end[s], cw[s], rows[s]
        for mb in range(nw[s], ni[s]):
            free += w
            row.append((kind_w, mb))
        end[s] = free
    return tuple(rows), max(end), max(round(x, 9) for x in peak)


def _ends_above(bound: float, end, nf, ni, nw, cf, ci, cw, m: int) -> bool:
    """Whether some stage, running back to back from its current end what it still owes, ends above ``bound``
    (by more than float rounding could explain): then so does the run."""
    if bound == INF:
        return False
    margin = bound + 1e-9 * abs(bound) + 1e-6
    for s, free in enumerate(end):
        if free + ((m - nf[s]) * cf[s] + (m - ni[s]) * ci[s] + (m - nw[s]) * cw[s]) > margin:
            return True
    return False


def distinct_runs(p: int, m: int, costs: Costs, memory_limit: float):
    """(depths, prioritize_b, no_bubble_greedy) of every distinct run: 8 flag combinations x 2 readings of
    the warm-up rule, runs whose warm-up depths and remaining flags coincide listed once."""
    seen = {}
    for lower in (False, True):
        for allow_bubble, prioritize_b, no_bubble_greedy in FLAGS:
            depths = warmup_depths(p, m, costs, memory_limit, allow_bubble, lower)
            seen.setdefault((depths, prioritize_b, no_bubble_greedy), None)
    return list(seen)


def candidates(p: int, m: int, costs: Costs, memory_limit: float, input_grad_frees: float):
    """(orders, makespan, peak) of every distinct run (``distinct_runs``)."""
    for depths, prioritize_b, no_bubble_greedy in distinct_runs(p, m, costs, memory_limit):
        yield heuristic_orders(p, m, costs, memory_limit, input_grad_frees, depths, prioritize_b, no_bubble_greedy)
