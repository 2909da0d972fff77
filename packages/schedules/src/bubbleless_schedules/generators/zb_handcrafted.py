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

The orders ignore costs (they are handcrafted); ``zb`` is the cost-aware scheduler.
"""

from __future__ import annotations

from ..action import Action, Kind
from ..placement import loop_placement
from ..registry import register
from ..schedule import Schedule


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


@register("zb-h1")
def zb_h1(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None) -> Schedule:
    """ZB-H1: 1F1B's memory (p M_B), bubble (p-1)/(3m+p-1) at unit costs for m >= p."""
    p = num_ranks
    return delayed_w_schedule(p, num_microbatches, lambda r: p - 1 - r, lambda r: r, "zb-h1")


@register("zb-h2")
def zb_h2(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None) -> Schedule:
    """ZB-H2: peak min(2p-1, m) M_B, no idle inside any rank's span at unit costs for m >= 2p-1."""
    p = num_ranks
    return delayed_w_schedule(p, num_microbatches, lambda r: 2 * (p - 1 - r), lambda r: 2 * r, "zb-h2")
