"""A makespan no schedule on a given placement can beat, cheap enough to prune ``auto``'s candidates.

Every rank must run, for each micro-batch, the forward and the backward (B, or I and W) of each stage
it holds, one action at a time; and it cannot start before the first micro-batch's forward has come
through the stages before its own first stage (with ``comm`` at each change of rank). So rank r ends
no earlier than ``head_r + work_r``, and the makespan is at least the largest of these. ``auto`` skips
a generator whose bound is not below the best makespan it already has (it could at most tie).

A generator publishes its placement as ``fn.placement_of = <num_ranks -> stage_to_rank>``; one whose
placement depends on options (interleaved 1F1B's chunks) does not, and ``auto`` bounds the schedule it built
instead (with the fused backward's chain, ``fused_backward``) before simulating it. It may also
publish ``fn.peak_of = <(num_ranks, num_microbatches) -> the most M_B it uses without a limit>``: among
equal bounds ``auto`` tries the most frugal first, so a tie it then skips could not have had less memory.
A generator with a memory cap may publish ``fn.memory_bound_of = <(num_ranks, num_microbatches, costs,
memory_limit) -> a makespan its cap forbids beating>`` (the V family: ``v_memory_bound``), which ``auto``
takes instead when higher: at p=32, m=256 with the paper's profile it skips V-Min's and V-Half's searches
once ZB-V's schedule is in hand.
"""

from __future__ import annotations

from ..action import Kind
from ..costs import Costs


def placement_bound(
    stage_to_rank: tuple[int, ...], num_microbatches: int, costs: Costs, fused_backward: bool = False
) -> float:
    """max over ranks of (earliest first forward + the rank's compute); 0.0 when ``costs`` give per-stage
    values for another stage count (the generator refuses such costs itself).

    ``fused_backward``: the schedule runs only F and B (no split I / W). A rank's last action is then a B (each
    of its forwards has its B on the same rank, later), and that micro-batch's B's of every stage below follow
    it one after another; so the rank's bound grows by the shortest such chain below one of its stages."""
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
    tail = [0.0] * ranks
    if fused_backward:
        below = [0.0] * stages  # the B chain from stage s-1 down to stage 0, with comm at each change of rank
        for s in range(1, stages):
            hop = costs.comm if stage_to_rank[s] != stage_to_rank[s - 1] else 0.0
            below[s] = below[s - 1] + costs.of(Kind.B, s - 1, per_rank) + hop
        tail = [min(below[s] for s, owner in enumerate(stage_to_rank) if owner == r) for r in range(ranks)]
    return max(start[r] + work[r] + tail[r] for r in range(ranks))


def v_memory_bound(num_ranks: int, num_microbatches: int, costs: Costs, cap_chunks: float) -> float:
    """A makespan no V schedule (rank r holds stages r and 2p-1-r) holding at most ``cap_chunks`` chunk
    activations per rank can beat, when I frees nothing (``input_grad_frees=0``; 0.0 otherwise is the
    caller's job). For each rank it adds to the rank's compute two idle times the cap forces on it
    (time 0 = rank 0's first forward, which starts the schedule: every action waits for one of its forwards):

    - warm-up: no I on rank r starts before ``head``, the first micro-batch's forward through all 2p stages
      and its input-gradient back to stage 2p-1-r (with comm at each change of rank), and nothing on rank r
      frees memory before its first W, which follows one of those I's; so before ``head`` rank r runs at
      most ``cap`` forwards, and idles at least ``head - cap x (its longest forward)``;
    - cool-down: once rank r's last first-chunk forward (micro-batch m-1) ends, that micro-batch still has
      ``tail`` to go (forwards of stages r+1..2p-1, input-gradients of all 2p, the W of stage 0, comm),
      while rank r only has the remaining passes of the micro-batches it holds, at most ``cap`` of them
      (each holds a chunk), each at most its second-chunk F, I, W and first-chunk I, W.

    The two windows are disjoint when m > cap (the last first-chunk forward is then past the first W);
    otherwise only the larger idle counts. The bound is the largest over ranks."""
    p, m, c = num_ranks, num_microbatches, float(cap_chunks)
    stages = 2 * p
    given = costs.num_stages_given()
    if given is not None and given != stages:
        return 0.0
    f = [costs.of(Kind.F, s, 2) for s in range(stages)]
    i = [costs.of(Kind.I, s, 2) for s in range(stages)]
    w = [costs.of(Kind.W, s, 2) for s in range(stages)]
    comm = costs.comm
    forward_all = sum(f) + (stages - 2) * comm  # stages p-1 and p share a rank: 2p-2 changes each way
    grad_all = sum(i) + (stages - 2) * comm
    best = 0.0
    for r in range(p):
        up = stages - 1 - r  # the rank's second-chunk stage
        head = forward_all + sum(i[up + 1 :]) + r * comm
        tail = sum(f[r + 1 :]) + (stages - 2 - r) * comm + grad_all + w[0]
        remaining = f[up] + i[up] + w[up] + i[r] + w[r]
        warm = max(0.0, head - c * max(f[r], f[up]))
        cool = max(0.0, tail - c * remaining)
        work = m * (f[r] + i[r] + w[r] + f[up] + i[up] + w[up])
        best = max(best, work + (warm + cool if m > c else max(warm, cool)))
    return best
