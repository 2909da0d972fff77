"""The state of a ``vshape_greedy.v_list_schedule`` run, in its own record so a run can start part-way
(``vshape_resume`` builds one from a fixed order's timing) as well as from time 0."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..action import Action


@dataclass
class ListState:
    """Where a ``v_list_schedule`` run stands: per stage, each micro-batch's forward and input-gradient end
    (-1: not run) and the next of each; per rank, chunk activations held and the peak, admitted micro-batches
    not yet up the second chunk, pending W's (oldest first) and their count per chunk, when it falls free, its
    first start, its actions so far and its script's remaining tokens; actions left, the wake-ups (time, rank)
    and the latest end. ``vshape_resume`` builds one part-way through a fixed order."""

    f_done: list[list[float]]
    g_done: list[list[float]]
    next_f: list[int]
    next_i: list[int]
    held: list[float]
    peak: list[float]
    admitted_not_up: list[int]
    pending_w: list[deque]
    pending_of: list[list[int]]
    free_at: list[float]
    first_start: list[float]
    out: list[list[Action]]
    remaining: int
    events: list[tuple[float, int]]
    scripts: list[deque]
    makespan: float

    @classmethod
    def start(cls, p: int, m: int, scripts: Sequence[Sequence[str]] | None = None) -> ListState:
        """Time 0: nothing run, every rank free (its script whole, if any)."""
        n = 2 * p
        return cls(
            [[-1.0] * m for _ in range(n)], [[-1.0] * m for _ in range(n)], [0] * n, [0] * n, [0.0] * p,
            [0.0] * p, [0] * p, [deque() for _ in range(p)], [[0, 0] for _ in range(p)], [0.0] * p, [-1.0] * p,
            [[] for _ in range(p)], 3 * n * m, [(0.0, r) for r in range(p)],
            [deque(s) for s in scripts] if scripts is not None else [deque() for _ in range(p)], 0.0,
        )
