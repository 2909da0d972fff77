"""Independent references for ZB-V (handcrafted and sail-sg's greedy) and DualPipeV.

Written from ``shared/reference/schedule-algorithms.md`` alone (sections "ZB-V" and "DualPipeV"),
never from ``bubbleless_schedules.generators``; shared helpers come from ``published_v.py``.

- ``handcrafted_zbv``: PyTorch/Primus ``zbv-formatted`` as described: rank r runs 2(p-r)-1 F0, r
  pairs (F1, F0), p-r triples (F1, B1, W1), steady (F0, B0, W0, F1, B1, W1), cool-down r pairs
  (B0, B1), p-r pairs (B0, W0), then the remaining W1, W0; built for m' = max(2p-1, m) and ops with
  index >= m dropped. Reproduces the unit-cost whole-makespan bubble (p-1)/(6m+p-1) for m >= 2p and
  zero idle inside every rank's span (``__main__``).
- ``greedy_zbv``: sail-sg ``zbv.py`` as described, a list scheduler with per-stage counters: W first
  when the next backward would exceed memory; backward B1 before B0; before a backward or forward,
  W's that fit entirely in the wait (and one more when the wait exceeds the approved bubble, options
  fill_b / fill_f); then F1 if ready, else F0 while memory allows. All four fill_b x fill_f
  combinations are run and the fastest kept. Not built: the warm-up balance rule and the
  approved-bubble refinement rounds (the list scheduler's warm-up admits F0 while memory allows).
- ``dualpipev``: DeepSeek's DualPipeV step structure on rank r: 2(p-r-1) F0; r+1 (F0, F1); p-r-1
  (B1 split, W1, F1); m-2p+r+1 (F0, B1, F1, B0), each pair overlapped upstream and charged in full
  here; p-r-1 (B1, F1, B0); r+1 (B1, B0) whose second half splits I from W (chunk 1 first on odd
  ranks, chunk 0 first on even ones); p-r-1 (W, B0 split); the remaining W. Needs m >= 2p; peak
  p + 1/2 M_B; at unit costs the whole-makespan bubble is (p-1)/(6m+p-1).
"""

from __future__ import annotations

import heapq
from collections import deque

from bubbleless_schedules import Action, Costs, Kind, Schedule

try:
    from .published_v import EPS, as_schedule, fastest_fitting, fits, stage_of
except ImportError:  # run as a script: python bench/schedules/published_v_zbv.py
    from published_v import EPS, as_schedule, fastest_fitting, fits, stage_of  # type: ignore[no-redef]


def _script_rank(r: int, p: int, m: int) -> list[Action]:
    mp = max(2 * p - 1, m)
    count = {key: 0 for key in ("F0", "F1", "B0", "B1", "W0", "W1")}
    row: list[Action] = []
    kind_of = {"F": Kind.F, "B": Kind.I, "W": Kind.W}

    def emit(token: str) -> None:
        kind, chunk = token[0], int(token[1])
        k = count[token]
        if k >= mp:
            return
        if kind == "B" and count["F" + str(chunk)] <= k:
            return
        if kind == "W" and count["B" + str(chunk)] <= k:
            return
        if token == "F1" and count["F0"] <= k:
            return
        count[token] += 1
        row.append(Action(stage_of(p, r, chunk), kind_of[kind], k))

    for _ in range(2 * (p - r) - 1):
        emit("F0")
    for _ in range(r):
        emit("F1")
        emit("F0")
    for _ in range(p - r):
        for t in ("F1", "B1", "W1"):
            emit(t)
    while count["F0"] < mp or count["F1"] < mp:
        for t in ("F0", "B0", "W0", "F1", "B1", "W1"):
            emit(t)
    for _ in range(r):
        emit("B0")
        emit("B1")
    for _ in range(p - r):
        emit("B0")
        emit("W0")
    while count["B0"] < mp or count["B1"] < mp or count["W0"] < mp or count["W1"] < mp:
        before = len(row)
        for t in ("B1", "B0", "W1", "W0"):
            emit(t)
        assert len(row) > before
    return [a for a in row if a.microbatch < m]


def handcrafted_zbv(p: int, m: int, costs: Costs, limit_m_b: float | None) -> Schedule:
    schedule = as_schedule(p, m, [_script_rank(r, p, m) for r in range(p)], "zbv-handcrafted")
    if not fits(schedule, limit_m_b):
        raise ValueError("handcrafted ZB-V needs p M_B")
    return schedule


def _greedy_zbv_once(p: int, m: int, costs: Costs, cap: float, fill_b: bool, fill_f: bool):
    n = 2 * p
    rank = [s if s < p else n - 1 - s for s in range(n)]
    comm = float(costs.comm)
    cost = {(k, s): costs.of(k, s, 2) for k in (Kind.F, Kind.I, Kind.W) for s in range(n)}
    f_end = [[None] * m for _ in range(n)]
    g_end = [[None] * m for _ in range(n)]
    nf, ni = [0] * n, [0] * n
    held = [0] * p
    pending = [deque() for _ in range(p)]
    out = [[] for _ in range(p)]
    free = [0.0] * p
    heap = [(0.0, r) for r in range(p)]
    left = 3 * n * m

    def arrive(t, src, r):
        return t + (comm if rank[src] != r else 0.0)

    def ready_b(r, s):
        k = ni[s]
        if k >= m or f_end[s][k] is None:
            return None
        t = f_end[s][k]
        if s != n - 1:
            if g_end[s + 1][k] is None:
                return None
            t = max(t, arrive(g_end[s + 1][k], s + 1, r))
        return t

    def ready_f(r, s):
        k = nf[s]
        if k >= m:
            return None
        if s == 0:
            return 0.0
        if f_end[s - 1][k] is None:
            return None
        return arrive(f_end[s - 1][k], s - 1, r)

    while left:
        if not heap:
            return None
        now, r = heapq.heappop(heap)
        if now < free[r] - EPS:
            continue
        s0, s1 = r, n - 1 - r
        bs = [(t, s) for s in (s1, s0) if (t := ready_b(r, s)) is not None]  # B1 before B0 on a tie
        fs = [(t, s) for s in (s1, s0) if (t := ready_f(r, s)) is not None and held[r] + 1 <= cap + EPS]
        if s0 == r and held[r] + 2 > cap + EPS:
            fs = [(t, s) for t, s in fs if s != s0]  # keep room for F1 of what is admitted
        action = None
        if pending[r] and held[r] >= cap - EPS and not bs:
            action = ("W",)
        ready_bs = [x for x in bs if x[0] <= now + EPS]
        ready_fs = [x for x in fs if x[0] <= now + EPS]
        if action is None and ready_bs:
            action = ("B", ready_bs[0][1])
        elif action is None and ready_fs:
            action = ("F", ready_fs[0][1])
        elif action is None and pending[r]:
            nxt = min([t for t, _ in bs] + [t for t, _ in fs], default=None)
            w = cost[(Kind.W, pending[r][0][0])]
            fill = fill_b if bs else fill_f
            if nxt is None or now + w <= nxt + EPS or fill:
                action = ("W",)
        if action is None:
            nxt = min([t for t, _ in bs] + [t for t, _ in fs], default=None)
            if nxt is not None:
                heapq.heappush(heap, (nxt, r))
            continue
        if action[0] == "W":
            s, k = pending[r].popleft()
            end = now + cost[(Kind.W, s)]
            held[r] -= 1
            out[r].append(Action(s, Kind.W, k))
        elif action[0] == "B":
            s = action[1]
            k = ni[s]
            ni[s] += 1
            end = now + cost[(Kind.I, s)]
            g_end[s][k] = end
            pending[r].append((s, k))
            out[r].append(Action(s, Kind.I, k))
            if s > 0:
                heapq.heappush(heap, (arrive(end, s, rank[s - 1]), rank[s - 1]))
        else:
            s = action[1]
            k = nf[s]
            nf[s] += 1
            end = now + cost[(Kind.F, s)]
            f_end[s][k] = end
            held[r] += 1
            out[r].append(Action(s, Kind.F, k))
            if s < n - 1:
                heapq.heappush(heap, (arrive(end, s, rank[s + 1]), rank[s + 1]))
        free[r] = end
        left -= 1
        heapq.heappush(heap, (end, r))
    return out


def greedy_zbv(p: int, m: int, costs: Costs, limit_m_b: float | None) -> Schedule:
    cap = 2 * p if limit_m_b is None else min(2 * p, int(2 * limit_m_b + EPS))
    if cap < 2:
        raise ValueError("greedy zbv needs 1 M_B")
    runs = (_greedy_zbv_once(p, m, costs, cap, fill_b, fill_f) for fill_b in (True, False) for fill_f in (True, False))
    candidates = (as_schedule(p, m, rows, "zbv-greedy") for rows in runs if rows is not None)
    return fastest_fitting(candidates, costs, cap / 2, f"greedy zbv found nothing within {cap} chunks")


def _dualpipev_rank(r: int, p: int, m: int) -> list[Action]:
    nxt = {(k, c): 0 for k in "FB" for c in (0, 1)}
    weights: deque = deque()
    row: list[Action] = []

    def fwd(c):
        row.append(Action(stage_of(p, r, c), Kind.F, nxt[("F", c)]))
        nxt[("F", c)] += 1

    def bwd(c, split=False):
        s, k = stage_of(p, r, c), nxt[("B", c)]
        nxt[("B", c)] += 1
        if split:
            row.append(Action(s, Kind.I, k))
            weights.append(Action(s, Kind.W, k))
        else:
            row.append(Action(s, Kind.B, k))

    def wgt():
        if weights:
            row.append(weights.popleft())

    for _ in range(2 * (p - r - 1)):
        fwd(0)
    for _ in range(r + 1):
        fwd(0)
        fwd(1)
    for _ in range(p - r - 1):
        bwd(1, True)
        wgt()
        fwd(1)
    for _ in range(m - 2 * p + r + 1):
        fwd(0)
        bwd(1)
        fwd(1)
        bwd(0)
    for _ in range(p - r - 1):
        bwd(1)
        fwd(1)
        bwd(0)
    steps = r + 1
    split = False
    for i in range(steps):
        if i == steps // 2 and r % 2 == 1:
            split = True
        bwd(1, split)
        if i == steps // 2 and r % 2 == 0:
            split = True
        bwd(0, split)
    for _ in range(p - r - 1):
        wgt()
        bwd(0, True)
    while weights:
        wgt()
    return row


def dualpipev(p: int, m: int, costs: Costs, limit_m_b: float | None) -> Schedule:
    if m < 2 * p:
        raise ValueError("DualPipeV needs m >= 2p")
    schedule = as_schedule(p, m, [_dualpipev_rank(r, p, m) for r in range(p)], "dualpipev-published")
    if not fits(schedule, limit_m_b):
        raise ValueError("DualPipeV needs p + 1/2 M_B")
    return schedule


if __name__ == "__main__":
    from bubbleless_schedules import simulate, validate

    for p, m in ((4, 8), (4, 12), (8, 16)):
        for fn in (handcrafted_zbv, greedy_zbv, dualpipev):
            tl = simulate(validate(fn(p, m, Costs.unit(), None)))
            print(fn.__name__, p, m, round(tl.bubble_rate, 4), "closed", round((p - 1) / (6 * m + p - 1), 4),
                  "span", round(tl.span_bubble_rate, 4), "peak", tl.max_peak_memory)
