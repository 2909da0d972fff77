"""An exhaustive slot search for V schedules at even unit costs: one more candidate of the V search.

When every chunk pass costs the same (F = I = W on every stage, no comm) and I frees nothing, a schedule
is a table of unit slots, and "does one finish within T slots under a cap of M chunk activations" is a
finite question. This module answers it by depth-first search, slot by slot, every rank choosing one
action per slot, with three rules that lose no solution:

- passes of one stage and kind run in micro-batch order (micro-batches are interchangeable);
- a rank never idles while an I or a W is ready (running it now instead of later frees the later slot and
  never delays anything, since an I needs no memory and a W only frees), and its W's are interchangeable
  (no pass waits for a W), so one W stands for all;
- a state (how many passes of each stage and kind are done) that failed at slot t fails at any later slot.

It prunes with the remaining work of each rank and two chains: the last micro-batch still has its
remaining forwards, input-gradients and stage 0's W to go one after another, and rank r's last
first-chunk input-gradient is followed by r more and stage 0's W, while every F and I of rank r comes
before it. ``node_budget`` bounds the work; None means "not found within it". At p=4 it proves the
controllable-memory paper's V-Half closed form (m=8, 3 M_B: 26.5, and 26 infeasible) in about a
thousand states; at p=8 its budget usually runs out.
"""

from __future__ import annotations

from itertools import product

from ..action import Action, Kind

_KINDS = (Kind.F, Kind.I, Kind.W)


class _Budget(Exception):
    pass


def exact_slot_orders(
    p: int, m: int, cap_chunks: float, slots: int, node_budget: int = 20_000
) -> list[list[Action]] | None:
    """Per-rank orders finishing within ``slots`` unit slots under ``cap_chunks``, or None (infeasible or
    over budget: ``node_budget`` slot choices tried). Rank r holds stages r and 2p-1-r."""
    n = 2 * p
    cap = int(cap_chunks + 1e-9)
    stages_of = [(r, n - 1 - r) for r in range(p)]
    failed: dict[tuple, int] = {}
    trace: list[tuple] = []
    nodes = 0

    def options(state: tuple, r: int) -> list:
        held = sum(state[3 * s] - state[3 * s + 2] for s in stages_of[r])
        grads, weights, forwards = [], [], []
        for s in stages_of[r]:
            nf, ni, nw = state[3 * s : 3 * s + 3]
            if ni < m and nf > ni and (s == n - 1 or state[3 * (s + 1) + 1] > ni):
                grads.append((1, s))
            if nw < ni and not weights:
                weights.append((2, s))
            if nf < m and held < cap and (s == 0 or state[3 * (s - 1)] > nf):
                forwards.append((0, s))
        ready = grads + forwards + weights
        return ready if grads or weights else [*ready, None]

    def bound(state: tuple, t: int) -> int:
        worst = 0
        for r in range(p):
            rest = forwards_and_grads = 0
            for s in stages_of[r]:
                nf, ni, nw = state[3 * s : 3 * s + 3]
                rest += 3 * m - nf - ni - nw
                forwards_and_grads += 2 * m - nf - ni
            worst = max(worst, rest, forwards_and_grads + r + 1 if forwards_and_grads else 0)
        last = m - 1
        chain = sum(state[3 * s] <= last for s in range(n)) + sum(state[3 * s + 1] <= last for s in range(n))
        return t + max(worst, chain + (state[2] <= last))

    def search(state: tuple, t: int) -> bool:
        nonlocal nodes
        if all(state[3 * s + 2] == m for s in range(n)):
            return True
        if bound(state, t) > slots or failed.get(state, slots + 1) <= t:
            return False
        failed[state] = t
        for combo in product(*(options(state, r) for r in range(p))):
            nodes += 1
            if nodes > node_budget:
                raise _Budget
            after = list(state)
            for choice in combo:
                if choice is not None:
                    after[3 * choice[1] + choice[0]] += 1
            trace.append(combo)
            if search(tuple(after), t + 1):
                return True
            trace.pop()
        return False

    try:
        if not search(tuple([0] * (3 * n)), 0):
            return None
    except _Budget:
        return None
    done = [0] * (3 * n)
    rows: list[list[Action]] = [[] for _ in range(p)]
    for combo in trace:
        for r, choice in enumerate(combo):
            if choice is None:
                continue
            kind, s = choice
            rows[r].append(Action(s, _KINDS[kind], done[3 * s + kind]))
            done[3 * s + kind] += 1
    return rows
