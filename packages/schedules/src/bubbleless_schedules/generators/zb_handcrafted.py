"""ZB-H1 and ZB-H2: the zero-bubble paper's handcrafted schedules (backward split into I and W).

Both are one pattern with two knobs. Rank r runs ``warmup`` forwards, then repeats "F, I" (while
forwards remain) and adds a W once ``lag`` input-gradients are waiting for theirs; the W's still owed
at the end run last. Delaying W lets every rank start its I's as early as 1F1B starts its B's, and the
delayed W's fill the gaps of the cool-down. The rank's peak memory is ``warmup + 1 + lag`` M_B (with
``input_grad_frees=0``).

- ZB-H1: warmup p-1-r, lag r: peak p M_B on every rank, as 1F1B. With unit costs and m >= p the
  makespan is 3m + p - 1, a whole-makespan bubble of (p-1)/(3m+p-1).
- ZB-H2: warmup 2(p-1-r), lag 2r: peak min(2p-1, m) M_B on the first rank (2p-1 on every rank once
  m >= 2p-1). With unit costs and m >= 2p-1 no rank is ever idle inside its own span (fewer
  micro-batches cannot cover the first rank's wait for its first gradient, 2p-1 forwards long).
  Below that, the deeper warm-up buys nothing and the longer W lag can make ZB-H2 slower than ZB-H1
  (p=8, m=7: 32 against 29 at unit costs); ``zb`` and ``auto`` pick the better order for such shapes.

Each name returns its handcrafted order unless ``zb``'s search (``zb_auto.best_orders``: our greedy, the
published round-based heuristic, local search) under the same memory -- p M_B for ZB-H1, 2p for ZB-H2,
or the caller's lower ``memory_limit`` -- finds a strictly faster order for the given costs; so each is
at least as fast as sail-sg's ``zb-h1`` / ``zb-h2`` (that heuristic under p and 2p) and as the pattern.
At unit costs the patterns are optimal for m >= p (H1) and m >= 2p-1 (H2) and are kept; below (p=4,
m=4: H2's pattern 16, the heuristic's 15) the faster order wins.
"""

from __future__ import annotations

from ..action import Action, Kind
from ..costs import Costs
from ..placement import loop_placement
from ..registry import register
from ..schedule import Schedule
from .zb_greedy import to_actions


def delayed_w_pairs(num_microbatches: int, warmup: int, lag: int) -> list[tuple[Kind, int]]:
    """One rank's (kind, micro-batch) order: ``warmup`` forwards, then F-I pairs with W's ``lag`` I's
    behind, then the W's still owed."""
    m = num_microbatches
    warmup = min(warmup, m)
    row = [(Kind.F, k) for k in range(warmup)]
    forwards, weights = warmup, 0
    for k in range(m):
        if forwards < m:
            row.append((Kind.F, forwards))
            forwards += 1
        row.append((Kind.I, k))
        if k + 1 - weights > lag:
            row.append((Kind.W, weights))
            weights += 1
    row += [(Kind.W, k) for k in range(weights, m)]
    return row


def delayed_w_schedule(num_ranks: int, num_microbatches: int, warmup, lag, name: str) -> Schedule:
    """A one-stage-per-rank schedule whose rank r follows ``delayed_w_pairs(m, warmup(r), lag(r))``."""
    p, m = num_ranks, num_microbatches
    actions = [[Action(r, kind, mb) for kind, mb in delayed_w_pairs(m, warmup(r), lag(r))] for r in range(p)]
    return Schedule(actions, num_stages=p, num_microbatches=m, stage_to_rank=loop_placement(p), name=name)


def _best_of(name: str, p: int, m: int, costs, memory_limit, frees: float, depth: int) -> Schedule:
    """The handcrafted order of ``depth`` (1: H1, 2: H2), unless ``zb``'s search under the same memory finds
    a strictly faster order for these costs; a limit below the handcrafted peak leaves only the search."""
    from .zb_auto import best_orders, check_limit  # zb_auto builds on this module's patterns

    design = float(depth * p)
    limit = design if memory_limit is None else min(design, float(memory_limit))
    check_limit(name, limit, frees)
    costs = Costs.unit() if costs is None else costs
    costs.check_stages(p)
    warmup, lag = (lambda r: depth * (p - 1 - r)), (lambda r: depth * r)
    peak = min(m, depth * (p - 1) + 1)  # warmup + 1 + lag on every rank, with I freeing nothing
    first = [delayed_w_pairs(m, warmup(r), lag(r)) for r in range(p)] if peak <= limit + 1e-9 else None
    orders, _ = best_orders(p, m, costs, limit, frees, first=first)
    return Schedule(to_actions(orders), num_stages=p, num_microbatches=m, stage_to_rank=loop_placement(p), name=name)


@register("zb-h1")
def zb_h1(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None, input_grad_frees=0.0) -> Schedule:
    """ZB-H1: 1F1B's memory (p M_B), bubble (p-1)/(3m+p-1) at unit costs for m >= p."""
    return _best_of("zb-h1", num_ranks, num_microbatches, costs, memory_limit, input_grad_frees, 1)


@register("zb-h2")
def zb_h2(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None, input_grad_frees=0.0) -> Schedule:
    """ZB-H2: peak at most 2p M_B (min(2p-1, m) for the handcrafted order), no idle inside any rank's span at
    unit costs for m >= 2p-1."""
    return _best_of("zb-h2", num_ranks, num_microbatches, costs, memory_limit, input_grad_frees, 2)


zb_h1.placement_of = zb_h2.placement_of = loop_placement  # for auto's bound and order (generators/bounds.py)
zb_h1.peak_of = lambda p, m: p
zb_h2.peak_of = lambda p, m: 2 * p
