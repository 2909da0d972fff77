"""A local search over round-robin cuts, judged by the list scheduler (the cut chosen with the dispatch).

The candidate cuts (``roundrobin_cut``) pack layers under a few job-time caps, so every group of one
kind is about the same size. With few jobs per device (small models: 20-30 layers on 8 devices, two or
three jobs each) the makespan depends on which device ends last, and a cap-packed cut rarely balances
that. ``refine`` starts from the best cut found and tries single moves, keeping the first that shortens
the list scheduler's makespan:

- move one layer across the boundary of two adjacent forward groups, or of two backward groups;
- move the fused last group's bottom layer into the body (the top forward and backward groups take
  it), or the body's top layer into the fused group;
- merge two adjacent groups of one kind, or split one in two.

The moves are scanned in a fixed order, from the first again after each improvement, until a full scan
finds nothing or the budget of dispatched actions (``ACTION_BUDGET``) is spent, so the result is deterministic
and generation stays fast on large models (whose cap-packed cuts already have many small jobs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..roundrobin_layout import PoolGroups

ACTION_BUDGET = 150_000
"""Actions the refinement may dispatch in all (evaluations x jobs x micro-batches x 2); the search gives it
less when its candidates took more (``roundrobin_search.SEARCH_BUDGET``)."""


def neighbours(groups: PoolGroups) -> Iterator[PoolGroups]:
    """Every cut one move away from ``groups`` (see the module docstring), in a fixed order."""
    forward, last, backward = list(groups.forward), groups.last, list(groups.backward)
    for kind in ("forward", "backward"):
        counts = forward if kind == "forward" else backward
        for changed in _shifts(counts):
            yield _with(groups, kind, changed)
    if forward and forward[-1] > 1 and backward[-1] > 1:
        yield PoolGroups(tuple(forward[:-1] + [forward[-1] - 1]), last + 1, tuple(backward[:-1] + [backward[-1] - 1]))
    if last > 1:
        yield PoolGroups(tuple(forward[:-1] + [forward[-1] + 1]) if forward else (1,), last - 1,
                         tuple(backward[:-1] + [backward[-1] + 1]) if backward else (1,))
        if forward:
            yield PoolGroups(tuple(forward + [1]), last - 1, tuple(backward + [1]))
    for kind in ("forward", "backward"):
        counts = forward if kind == "forward" else backward
        for changed in _merges_and_splits(counts):
            yield _with(groups, kind, changed)


def _with(groups: PoolGroups, kind: str, counts: list[int]) -> PoolGroups:
    if kind == "forward":
        return PoolGroups(tuple(counts), groups.last, groups.backward)
    return PoolGroups(groups.forward, groups.last, tuple(counts))


def _shifts(counts: list[int]) -> Iterator[list[int]]:
    for i in range(len(counts) - 1):
        for step in (1, -1):
            changed = list(counts)
            changed[i] += step
            changed[i + 1] -= step
            if min(changed[i], changed[i + 1]) >= 1:
                yield changed


def _merges_and_splits(counts: list[int]) -> Iterator[list[int]]:
    for i in range(len(counts) - 1):
        yield counts[:i] + [counts[i] + counts[i + 1]] + counts[i + 2:]
    for i, count in enumerate(counts):
        if count > 1:
            yield counts[:i] + [count // 2, count - count // 2] + counts[i + 1:]


def refine(start: PoolGroups, makespan: float, evaluate: Callable[[PoolGroups], float | None], *,
           actions_per_evaluation: Callable[[PoolGroups], int], budget: int | None = None,
           ) -> tuple[PoolGroups, float]:
    """The best cut the local search reaches from ``start`` (whose makespan is ``makespan``).

    ``evaluate(cut)`` is the list scheduler's makespan, or None when the cut does not fit the memory
    limit; ``actions_per_evaluation(cut)`` is what one evaluation dispatches, counted against ``budget``
    (default ``ACTION_BUDGET``)."""
    budget = ACTION_BUDGET if budget is None else budget
    best, best_span, spent = start, makespan, 0
    while True:
        improved = False
        for cut in neighbours(best):
            cost = actions_per_evaluation(cut)
            if spent + cost > budget:
                return best, best_span
            spent += cost
            span = evaluate(cut)
            if span is not None and span < best_span - 1e-9:
                best, best_span, improved = cut, span, True
                break
        if not improved:
            return best, best_span
