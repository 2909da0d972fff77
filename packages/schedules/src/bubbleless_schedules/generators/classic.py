"""GPipe and 1F1B: one stage per rank, full backward (B)."""

from __future__ import annotations

from ..action import B, F
from ..placement import loop_placement
from ..registry import register
from ..schedule import Schedule


@register("gpipe")
def gpipe(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None) -> Schedule:
    """All forwards, then all backwards: bubble (p-1)/(m+p-1), peak memory m M_B."""
    p, m = num_ranks, num_microbatches
    actions = [[F(r, i) for i in range(m)] + [B(r, i) for i in range(m)] for r in range(p)]
    return Schedule(actions, num_stages=p, num_microbatches=m, stage_to_rank=loop_placement(p), name="gpipe")


def one_f_one_b_order(rank: int, num_ranks: int, num_microbatches: int, warmup: int | None = None):
    """The 1F1B order of one rank as (kind, micro-batch) pairs: ``warmup`` forwards (p-1-rank by
    default), then one forward one backward, then the remaining backwards."""
    m = num_microbatches
    warmup = min(num_ranks - 1 - rank if warmup is None else warmup, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


@register("1f1b")
def one_f_one_b(*, num_ranks: int, num_microbatches: int, costs=None, memory_limit=None) -> Schedule:
    """Warm-up, steady one-forward-one-backward, cool-down: bubble (p-1)/(m+p-1), peak p M_B."""
    p, m = num_ranks, num_microbatches
    make = {"F": F, "B": B}
    actions = [[make[k](r, i) for k, i in one_f_one_b_order(r, p, m)] for r in range(p)]
    return Schedule(actions, num_stages=p, num_microbatches=m, stage_to_rank=loop_placement(p), name="1f1b")


# for auto's bound and its order among equal bounds (generators/bounds.py)
gpipe.placement_of = one_f_one_b.placement_of = loop_placement
gpipe.peak_of = lambda p, m: m
one_f_one_b.peak_of = lambda p, m: min(p, m)
