"""Local search over action orders: swap adjacent actions on a worker while the makespan improves.

Generic: it knows nothing about kinds or layouts. The caller gives

- ``rows``: one list of items per worker (``Action``s, or cheaper (kind, micro-batch) pairs);
- ``evaluate(rows) -> float``: the makespan of an order, ``inf`` when it deadlocks (use the simulator's
  rule, e.g. ``schedule_evaluator`` below or ``zb_greedy.evaluate_orders``);
- ``can_swap(a, b) -> bool``: whether two neighbours on one worker may trade places (say no for an item
  and the one that needs it, e.g. I and W of one micro-batch, to save an evaluation);
- ``fits(worker, row) -> bool``: whether the row keeps the memory limit.

First improvement, worker by worker, position by position; a pass that finds nothing ends the search.
``shifts`` moves one item several places at once (over items it may swap with), which crosses the
plateaus adjacent swaps stop at: at p=2 m=2 on the paper's 1.5B profile zbv needs one W moved two
places earlier, and each single swap on the way is slower.
``budget`` bounds the work as the number of evaluated actions (evaluations x actions per evaluation), so
the search costs the same on every machine and stays deterministic; the default, 3e5, is about 0.15 s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..costs import Costs
from ..layouts import layout_of
from ..schedule import Schedule
from ..simulate import run_order

_EPS = 1e-9


def adjacent_swaps(
    rows: Sequence[Sequence], evaluate: Callable[[list], float], *,
    can_swap: Callable[[object, object], bool] = lambda a, b: True,
    fits: Callable[[int, list], bool] = lambda worker, row: True,
    budget: float = 3e5,
    best: float | None = None,
) -> tuple[list[list], float]:
    """(improved rows, their makespan); the input is returned (copied) when nothing helps."""
    rows = [list(row) for row in rows]
    size = max(1, sum(len(row) for row in rows))
    best = evaluate(rows) if best is None else best
    left = budget / size  # evaluations we may still spend
    improved = True
    while improved and left >= 1:
        improved = False
        for worker, row in enumerate(rows):
            i = 0
            while i + 1 < len(row) and left >= 1:
                a, b = row[i], row[i + 1]
                if not can_swap(a, b):
                    i += 1
                    continue
                row[i], row[i + 1] = b, a
                if fits(worker, row):
                    left -= 1
                    value = evaluate(rows)
                    if value < best - _EPS:
                        best, improved = value, True
                        i = max(i - 1, 0)  # the earlier neighbour may now move too
                        continue
                row[i], row[i + 1] = a, b
                i += 1
    return rows, best


def shifts(
    rows: Sequence[Sequence], evaluate: Callable[[list], float], *,
    can_swap: Callable[[object, object], bool] = lambda a, b: True,
    fits: Callable[[int, list], bool] = lambda worker, row: True,
    budget: float = 3e5,
    best: float | None = None,
    reach: int = 4,
) -> tuple[list[list], float]:
    """Like ``adjacent_swaps``, but each move takes one item 2..``reach`` places earlier or later, over
    items it may swap with; the first improving move is kept, and passes repeat while one helps."""
    rows = [list(row) for row in rows]
    size = max(1, sum(len(row) for row in rows))
    best = evaluate(rows) if best is None else best
    left = budget / size
    improved = True
    while improved and left >= 1:
        improved = False
        for worker, row in enumerate(rows):
            for i in range(len(row)):
                if left < 1:
                    break
                for target in _targets(row, i, reach, can_swap):
                    item = row.pop(i)
                    row.insert(target, item)
                    if fits(worker, row):
                        left -= 1
                        value = evaluate(rows)
                        if value < best - _EPS:
                            best, improved = value, True
                            break
                    row.pop(target)
                    row.insert(i, item)
                    if left < 1:
                        break
    return rows, best


def _targets(row: list, i: int, reach: int, can_swap) -> list[int]:
    """Positions 2..``reach`` away that ``row[i]`` reaches passing only items it may swap with."""
    found = []
    for step in (-1, 1):
        j = i
        for distance in range(1, reach + 1):
            j = i + step * distance
            if not 0 <= j < len(row) or not can_swap(row[i], row[j]):
                break
            if distance >= 2:
                found.append(j)
    return found


def schedule_evaluator(schedule: Schedule, costs: Costs) -> Callable[[list], float]:
    """``evaluate`` for rows of ``Action``s of any layout, timed by the simulator's own event loop."""

    def evaluate(rows) -> float:
        try:
            runs = run_order(schedule.replace(actions=rows), costs)
        except ValueError:  # deadlock
            return float("inf")
        return max(end for _, _, _, end in runs) - min(start for _, _, start, _ in runs)

    return evaluate


def schedule_fits(schedule: Schedule, memory_limit: float | None, input_grad_frees: float = 0.0):
    """``fits`` for rows of ``Action``s: the worker's peak stays within ``memory_limit``."""
    layout = layout_of(schedule)

    def fits(worker: int, row) -> bool:
        if memory_limit is None:
            return True
        held = 0.0
        for action in row:
            held += layout.memory_delta(action, schedule, input_grad_frees)
            if held > memory_limit + _EPS:
                return False
        return True

    return fits


def independent(a, b) -> bool:
    """``can_swap`` for ``Action``s: different kinds, not of the same stage and micro-batch (one of those
    needs the other; two of one kind would only relabel micro-batches)."""
    return a.kind is not b.kind and not (a.stage == b.stage and a.microbatch == b.microbatch)
