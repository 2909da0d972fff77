"""Our own implementations of the reference systems' published zero-bubble heuristics.

Written from the papers' descriptions, not from their code, so the comparison bench can judge our
generators against what those systems would schedule under the same costs and memory limit:

- ``zb``: the zero-bubble paper's automatic greedy scheduler (Qi et al. 2024, section 3.3; sail-sg's
  ZB-1p / ZB-2p, shipped by Primus as ``zerobubble``): each rank runs a FIXED number of warm-up
  forwards (as many as fit before its first gradient returns, capped by the memory limit and by one
  fewer than the rank before it, so that at memory p it is 1F1B's p-r), then strictly
  alternates one I and one F, inserts a W wherever the next I would leave a gap at least as long as W
  or the next F would break the memory limit, and runs the W's still owed at the end.
- ``zb-h1`` / ``zb-h2``: the handcrafted schedules as PyTorch and Primus describe them: the 1F1B order
  with the backward split, W of rank r postponed by r (H1) or, with p-1-r extra warm-up forwards, by 2r
  (H2).
- ``interleaved-1f1b``: Megatron-LM's virtual-pipeline order (needs m to be a multiple of p).

Every callable is ``fn(*, num_ranks, num_microbatches, costs, memory_limit) -> Schedule``.
"""

from __future__ import annotations

import heapq
import math

from bubbleless_schedules import Action, Costs, Kind, Schedule, loop_placement


def _schedule(rows, p: int, m: int, name: str, chunks: int = 1) -> Schedule:
    return Schedule(rows, num_stages=p * chunks, num_microbatches=m, stage_to_rank=loop_placement(p, chunks), name=name)


# -- handcrafted ------------------------------------------------------------------------------------------
def _postponed_w_rank(rank: int, m: int, forwards_before_first_i: int, postpone: int) -> list[Action]:
    """1F1B with split backward: the first I after ``forwards_before_first_i`` forwards, then I and F
    alternate, and W(k) runs right after I(k + postpone)."""
    first = min(forwards_before_first_i, m)
    row = [Action(rank, Kind.F, k) for k in range(first)]
    next_f = first
    for k in range(m):
        row.append(Action(rank, Kind.I, k))
        if k - postpone >= 0:
            row.append(Action(rank, Kind.W, k - postpone))
        if next_f < m:
            row.append(Action(rank, Kind.F, next_f))
            next_f += 1
    row += [Action(rank, Kind.W, k) for k in range(max(0, m - postpone), m)]
    return row


def reference_zb_h1(*, num_ranks: int, num_microbatches: int, costs: Costs = None, memory_limit=None) -> Schedule:
    p, m = num_ranks, num_microbatches
    return _schedule([_postponed_w_rank(r, m, p - r, r) for r in range(p)], p, m, "ref-zb-h1")


def reference_zb_h2(*, num_ranks: int, num_microbatches: int, costs: Costs = None, memory_limit=None) -> Schedule:
    p, m = num_ranks, num_microbatches
    return _schedule([_postponed_w_rank(r, m, 2 * (p - r) - 1, 2 * r) for r in range(p)], p, m, "ref-zb-h2")


# -- Megatron interleaved ------------------------------------------------------------------------------------
def reference_interleaved_1f1b(
    *, num_ranks: int, num_microbatches: int, costs: Costs = None, memory_limit=None, chunks: int = 2
) -> Schedule:
    p, m, v = num_ranks, num_microbatches, chunks
    if m % p:
        raise ValueError(f"Megatron's interleaved schedule needs num_microbatches a multiple of {p}")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k % (p * v)) // p
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    rows = []
    for r in range(p):
        warmup = min(total, 2 * (p - r - 1) + (v - 1) * p)
        row = []
        for k in range(warmup):
            mb, c = unit(k, False)
            row.append(Action(c * p + r, Kind.F, mb))
        for k in range(total - warmup):
            mb, c = unit(warmup + k, False)
            row.append(Action(c * p + r, Kind.F, mb))
            mb, c = unit(k, True)
            row.append(Action(c * p + r, Kind.B, mb))
        for k in range(total - warmup, total):
            mb, c = unit(k, True)
            row.append(Action(c * p + r, Kind.B, mb))
        rows.append(row)
    return _schedule(rows, p, m, "ref-interleaved-1f1b", v)


# -- the paper's automatic greedy scheduler -----------------------------------------------------------------
def _per_stage(costs: Costs, p: int, kind: Kind) -> list[float]:
    return [costs.of(kind, s, 1.0) for s in range(p)]


def reference_zb(*, num_ranks: int, num_microbatches: int, costs: Costs = None, memory_limit=None) -> Schedule:
    """Fixed warm-up, strict I/F alternation, W into gaps >= W or when memory is full, W's at the end."""
    p, m = num_ranks, num_microbatches
    costs = costs or Costs.unit()
    limit = float(p if memory_limit is None else memory_limit)
    if limit < 1:
        raise ValueError("the zero-bubble scheduler needs memory for at least one micro-batch per rank")
    cf, ci, cw = (_per_stage(costs, p, k) for k in (Kind.F, Kind.I, Kind.W))
    comm = costs.comm
    warmup = []
    for r in range(p):
        trip = sum(cf[s] + ci[s] + 2 * comm for s in range(r + 1, p))
        fits = 1 + (math.floor(trip / cf[r] + 1e-9) if cf[r] > 0 else m)
        # a rank cannot usefully run ahead of the rank feeding it: one forward fewer than its predecessor
        upstream = warmup[-1] - 1 if warmup else m
        warmup.append(max(1, min(fits, math.floor(limit + 1e-9), m, upstream)))

    f_done = [[None] * m for _ in range(p)]
    i_done = [[None] * m for _ in range(p)]
    nf, ni, nw, free = [0] * p, [0] * p, [0] * p, [0.0] * p
    want_i = [False] * p  # in the steady phase the ranks alternate: after an F comes an I, then an F
    rows: list[list[Action]] = [[] for _ in range(p)]
    heap = [(0.0, r) for r in range(p)]
    parked: set[int] = set()

    def next_kind(r: int) -> Kind | None:
        if nf[r] < min(warmup[r], m):
            return Kind.F
        if ni[r] == m:
            return None
        return Kind.I if want_i[r] or nf[r] == m else Kind.F

    def ready_at(r: int, kind: Kind) -> float | None:
        """When the inputs of the rank's next ``kind`` arrive; None while their producer has not run."""
        if kind is Kind.F:
            if r == 0:
                return 0.0
            t = f_done[r - 1][nf[r]]
            return None if t is None else t + comm
        own = f_done[r][ni[r]]
        if r == p - 1 or own is None:
            return own
        t = i_done[r + 1][ni[r]]
        return None if t is None else max(own, t + comm)

    def run(r: int, kind: Kind, start: float, mb: int) -> None:
        end = start + {Kind.F: cf, Kind.I: ci, Kind.W: cw}[kind][r]
        rows[r].append(Action(r, kind, mb))
        free[r] = end
        for other in (r - 1, r + 1):
            if other in parked:
                parked.discard(other)
                heapq.heappush(heap, (max(end, free[other]), other))
        heapq.heappush(heap, (end, r))

    while heap:
        now, r = heapq.heappop(heap)
        if now < free[r] or nw[r] == m:
            continue
        kind = next_kind(r)
        ready = None if kind is None else ready_at(r, kind)
        memory_full = kind is Kind.F and nf[r] - nw[r] + 1 > limit + 1e-9
        gap_fits_w = ready is not None and ready - now >= cw[r] - 1e-9
        if nw[r] < ni[r] and (kind is None or memory_full or gap_fits_w):
            nw[r] += 1
            run(r, Kind.W, now, nw[r] - 1)
        elif kind is None or memory_full or ready is None:
            parked.add(r)
        elif kind is Kind.F:
            start = max(now, ready)
            f_done[r][nf[r]] = start + cf[r]
            nf[r] += 1
            want_i[r] = nf[r] >= warmup[r]
            run(r, Kind.F, start, nf[r] - 1)
        else:
            start = max(now, ready)
            i_done[r][ni[r]] = start + ci[r]
            ni[r] += 1
            want_i[r] = False
            run(r, Kind.I, start, ni[r] - 1)
    if any(n < m for n in nw):
        raise ValueError("the reference zero-bubble scheduler stalled for this shape")
    return _schedule(rows, p, m, "ref-zb")


REFERENCE = {
    "zb": reference_zb,
    "zb-h1": reference_zb_h1,
    "zb-h2": reference_zb_h2,
    "interleaved-1f1b": reference_interleaved_1f1b,
}
