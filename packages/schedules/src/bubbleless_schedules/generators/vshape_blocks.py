"""Building blocks for V schedules ("Pipeline Parallelism with Controllable Memory", Qi et al. 2024).

A building block places one micro-batch's 6p passes (F, I, W on each of the 2p chunks) on a grid of
unit slots; repeating it every 6 slots keeps every rank busy in the steady state, because each rank's
six passes take six different slots modulo 6. The block's lifespans (F to W on each chunk) set the
memory; ``turn_delay`` (slots between the last forward and the first input-gradient) lengthens them,
which buys warm-up forwards and so less bubble, at the price of memory. Sorting each rank's passes by
their slot time gives its order; executing that order as early as dependencies allow is the papers'
"squeezing".
"""

from __future__ import annotations

from ..action import Action, Kind


def _rank_of(stage: int, p: int) -> int:
    return stage if stage < p else 2 * p - 1 - stage


def v_block(num_ranks: int, turn_delay: int = 0) -> dict[tuple[Kind, int], int]:
    """Slot times of one micro-batch's passes: ``{(kind, stage): slot}``; each pass takes the first
    slot after its inputs whose residue modulo 6 is still free on its rank."""
    p = num_ranks
    used: list[set[int]] = [set() for _ in range(p)]
    times: dict[tuple[Kind, int], int] = {}

    def place(kind: Kind, stage: int, earliest: int) -> int:
        rank = _rank_of(stage, p)
        t = earliest
        while t % 6 in used[rank]:
            t += 1
        used[rank].add(t % 6)
        times[(kind, stage)] = t
        return t

    t = -1
    for s in range(2 * p):
        t = place(Kind.F, s, t + 1)
    t += turn_delay
    for s in reversed(range(2 * p)):
        t = place(Kind.I, s, t + 1)
    for s in reversed(range(2 * p)):
        place(Kind.W, s, times[(Kind.I, s)] + 1)
    return times


def block_orders(num_ranks: int, num_microbatches: int, turn_delay: int = 0) -> list[list[Action]]:
    """Each rank's order when the block repeats every 6 slots for ``num_microbatches`` micro-batches."""
    p = num_ranks
    block = v_block(p, turn_delay)
    timed: list[list[tuple[int, int, Action]]] = [[] for _ in range(p)]
    for k in range(num_microbatches):
        for (kind, stage), t in block.items():
            timed[_rank_of(stage, p)].append((t + 6 * k, stage, Action(stage, kind, k)))
    return [[a for _, _, a in sorted(row, key=lambda x: (x[0], x[1]))] for row in timed]


def as_tokens(order: list[Action], num_ranks: int) -> list[str]:
    """An order as ``vshape_greedy`` script tokens (``F0``, ``I1``, ``W``...)."""
    return [
        "W" if a.kind is Kind.W else f"{a.kind.value}{0 if a.stage < num_ranks else 1}"
        for a in order
    ]
