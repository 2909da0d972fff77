"""DualPipeV (DeepSeek): V placement, a forward of one micro-batch overlapped with a backward of another.

Rank i holds stages i and 2p-1-i. Each rank runs eight phases (DeepSeek's DualPipeV, written here
from its description): F0 warm-up; F0 F1 pairs; B1 W F1 with split backwards; the main phase of
overlapped pairs (F0 with B1, then F1 with B0); B1 then F1+B0; B1 B0 cool-down, whose second half
splits I from W; W then B0; the remaining W's. An overlapped pair is written as the forward followed by
the backward; an executor that can overlap them (compute of one, all-to-all of the other) runs them
together, and the simulator, which cannot, charges both. Needs m >= 2p micro-batches.

Cost-aware choice: which cool-down backwards split into I and a deferred W is what the published
order fixes by rank parity; this generator also tries splitting all of them (W's fill the cool-down
gaps) and none (W's fused, fewer actions) and keeps the fastest under the given costs. Measured: peak
memory p + 1/2 M_B (rank 0: 2p-1 first-chunk activations and both chunks of the next micro-batch);
with unit costs the published order's whole-makespan bubble is (p-1)/(6m+p-1), as ZB-V's.
"""

from __future__ import annotations

from collections import deque

from ..action import Action, Kind
from ..costs import Costs
from ..placement import v_placement
from ..registry import register
from ..schedule import Schedule
from ..simulate import peak_memory, simulate

SPLITS = ("published", "all", "none")
"""Which cool-down (phase 6) backwards split into I + deferred W."""


def _phase6_split(rank: int, i: int, chunk: int, steps: int, split: str) -> bool:
    if split != "published":
        return split == "all"
    half = steps // 2
    if rank % 2 == 1:
        return i >= half
    return i > half or (i == half and chunk == 0)


def dualpipev_rank_order(rank: int, num_ranks: int, num_microbatches: int, split: str = "published") -> list[Action]:
    """One rank's DualPipeV order."""
    p, m = num_ranks, num_microbatches
    stage = (rank, 2 * p - 1 - rank)
    next_mb = {(kind, chunk): 0 for kind in ("F", "B") for chunk in (0, 1)}
    weights: deque[tuple[int, int]] = deque()
    out: list[Action] = []

    def forward(chunk: int) -> None:
        k = next_mb[("F", chunk)]
        next_mb[("F", chunk)] += 1
        out.append(Action(stage[chunk], Kind.F, k))

    def backward(chunk: int, split_w: bool = False) -> None:
        k = next_mb[("B", chunk)]
        next_mb[("B", chunk)] += 1
        if split_w:
            out.append(Action(stage[chunk], Kind.I, k))
            weights.append((stage[chunk], k))
        else:
            out.append(Action(stage[chunk], Kind.B, k))

    def weight() -> None:
        s, k = weights.popleft()
        out.append(Action(s, Kind.W, k))

    for _ in range(2 * (p - rank - 1)):  # 1: F0 warm-up
        forward(0)
    for _ in range(rank + 1):  # 2: F0 F1
        forward(0)
        forward(1)
    for _ in range(p - rank - 1):  # 3: B1 W F1, zero-bubble split
        backward(1, split_w=True)
        weight()
        forward(1)
    for _ in range(m - 2 * p + rank + 1):  # 4: main phase, overlapped F0+B1 and F1+B0
        forward(0)
        backward(1)
        forward(1)
        backward(0)
    for _ in range(p - rank - 1):  # 5: B1, then overlapped F1+B0
        backward(1)
        forward(1)
        backward(0)
    steps = rank + 1
    for i in range(steps):  # 6: B1 B0, the later ones split
        backward(1, _phase6_split(rank, i, 1, steps, split))
        backward(0, _phase6_split(rank, i, 0, steps, split))
    for _ in range(p - rank - 1):  # 7: W B0
        if weights:
            weight()
        backward(0, split_w=True)
    while weights:  # 8: the remaining W's
        weight()
    return out


def dualpipev_schedule(num_ranks: int, num_microbatches: int, split: str = "published") -> Schedule:
    p, m = num_ranks, num_microbatches
    if m < 2 * p:
        raise ValueError(
            f"dualpipev needs at least 2 * num_ranks = {2 * p} micro-batches (its warm-up sends 2(p-1) "
            f"forwards down before the first backward); got num_microbatches={m}"
        )
    actions = [dualpipev_rank_order(r, p, m, split) for r in range(p)]
    return Schedule(actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p), name="dualpipev")


_EVALUATE_UP_TO = 20_000
"""Above this many actions only the published order is built (simulating all three would take seconds)."""


@register("dualpipev")
def dualpipev(*, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None, **options) -> Schedule:
    """DualPipeV: the fastest of its cool-down split choices under ``costs``; peak p + 1/2 M_B."""
    input_grad_frees = float(options.pop("input_grad_frees", 0.0))
    if options:
        raise ValueError(f"dualpipev takes no options {sorted(options)}; it accepts input_grad_frees only")
    costs.check_stages(2 * num_ranks)
    published = dualpipev_schedule(num_ranks, num_microbatches)
    if 6 * num_ranks * num_microbatches > _EVALUATE_UP_TO:
        return published
    best, best_key = published, None
    for split in SPLITS:
        schedule = published if split == "published" else dualpipev_schedule(num_ranks, num_microbatches, split)
        peak = max(peak_memory(schedule, input_grad_frees))
        if memory_limit is not None and peak > memory_limit + 1e-9:
            continue
        key = (round(simulate(schedule, costs).makespan, 9), peak)
        if best_key is None or key < best_key:
            best, best_key = schedule, key
    return best


dualpipev.placement_of = v_placement  # for auto's bound and order (generators/bounds.py)
dualpipev.peak_of = lambda p, m: p + 0.5
