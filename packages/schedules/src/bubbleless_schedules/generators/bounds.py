"""A makespan no schedule on a given placement can beat, cheap enough to prune ``auto``'s candidates.

Every rank must run, for each micro-batch, the forward and the backward (B, or I and W) of each stage
it holds, one action at a time; and it cannot start before the first micro-batch's forward has come
through the stages before its own first stage (with ``comm`` at each change of rank). So rank r ends
no earlier than ``head_r + work_r``, and the makespan is at least the largest of these. ``auto`` skips
a generator whose bound is not below the best makespan it already has (it could at most tie).

A generator publishes its placement as ``fn.placement_of = <num_ranks -> stage_to_rank>``; one whose
placement depends on options (interleaved 1F1B's chunks) does not, and is never pruned. It may also
publish ``fn.peak_of = <(num_ranks, num_microbatches) -> the most M_B it uses without a limit>``: among
equal bounds ``auto`` tries the most frugal first, so a tie it then skips could not have had less memory.
"""

from __future__ import annotations

from ..action import Kind
from ..costs import Costs


def placement_bound(stage_to_rank: tuple[int, ...], num_microbatches: int, costs: Costs) -> float:
    """max over ranks of (earliest first forward + the rank's compute); 0.0 when ``costs`` give per-stage
    values for another stage count (the generator refuses such costs itself)."""
    stages = len(stage_to_rank)
    given = costs.num_stages_given()
    if given is not None and given != stages:
        return 0.0
    ranks = max(stage_to_rank) + 1
    per_rank = stages / ranks
    head = [0.0] * stages  # earliest start of stage s's first forward
    for s in range(1, stages):
        hop = costs.comm if stage_to_rank[s] != stage_to_rank[s - 1] else 0.0
        head[s] = head[s - 1] + costs.of(Kind.F, s - 1, per_rank) + hop
    start = [float("inf")] * ranks
    work = [0.0] * ranks
    for s, r in enumerate(stage_to_rank):
        start[r] = min(start[r], head[s])
        work[r] += num_microbatches * (costs.of(Kind.F, s, per_rank) + costs.of(Kind.B, s, per_rank))
    return max(start[r] + work[r] for r in range(ranks))
