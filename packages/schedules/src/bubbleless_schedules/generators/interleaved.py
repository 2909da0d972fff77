"""Interleaved 1F1B (Megatron-LM's virtual pipeline): v chunks per rank, looped placement.

Rank r holds stages r, r+p, r+2p, ... Micro-batches go in rounds of ``g`` (a round is as many
micro-batches as ranks, or a few more when they do not divide evenly): within a round a rank runs the
forwards of chunk 0 for every micro-batch of the round, then chunk 1, and so on; backwards mirror this
with the chunks reversed. Rank r warms up with (v-1) g + 2 (p-1-r) forwards, then alternates one
forward and one full backward (B), then drains. With unit costs and m a multiple of p the whole-makespan
bubble is (p-1)/(v m + p-1), about 1/v of 1F1B's, at a peak of a little over p M_B.
"""

from __future__ import annotations

from ..action import B, F
from ..placement import loop_placement
from ..registry import register
from ..schedule import Schedule


def round_size(num_ranks: int, num_microbatches: int) -> int:
    """Micro-batches per round: ``m // rounds`` with ``rounds = max(1, m // p)``; the rounds must be equal."""
    rounds = max(1, num_microbatches // num_ranks)
    if num_microbatches % rounds:
        size = num_microbatches // rounds
        raise ValueError(
            f"interleaved-1f1b runs micro-batches in equal rounds of at least num_ranks={num_ranks}; "
            f"num_microbatches={num_microbatches} does not split into {rounds} rounds of {size}. Use a multiple "
            f"of {num_ranks}, or any count below {2 * num_ranks}"
        )
    return num_microbatches // rounds


def chunk_orders(num_microbatches: int, chunks: int, group: int) -> tuple[list, list]:
    """The (micro-batch, chunk) order every rank follows for forwards and for backwards."""
    units = [(mb, c) for mb in range(num_microbatches) for c in range(chunks)]
    forward = sorted(units, key=lambda u: (u[0] // group, u[1], u[0] % group))
    backward = sorted(units, key=lambda u: (u[0] // group, -u[1], u[0] % group))
    return forward, backward


def warmup_forwards(rank: int, num_ranks: int, chunks: int, group: int) -> int:
    """Forwards before the first backward. The doubled 2 (p-1-r) covers the wait for the next chunk's
    input; with one chunk there is no such wait and the count is 1F1B's p-1-r (so v=1 *is* 1F1B)."""
    if chunks == 1:
        return num_ranks - 1 - rank
    return (chunks - 1) * group + 2 * (num_ranks - 1 - rank)


@register("interleaved-1f1b")
def interleaved_1f1b(*, num_ranks: int, num_microbatches: int, chunks_per_rank: int = 2, costs=None, memory_limit=None) -> Schedule:
    """Interleaved 1F1B with ``chunks_per_rank`` (v, default 2) looped chunks per rank.

    Needs the micro-batches to split into equal rounds (see ``round_size``).
    """
    p, m, v = num_ranks, num_microbatches, chunks_per_rank
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"chunks_per_rank must be an integer >= 1, got {v!r}")
    group = round_size(p, m) if v > 1 else m  # one chunk: no rounds to keep apart
    forward, backward = chunk_orders(m, v, group)
    actions = []
    for r in range(p):
        warmup = min(warmup_forwards(r, p, v, group), m * v)
        row = [F(c * p + r, mb) for mb, c in forward[:warmup]]
        for (f_mb, f_c), (b_mb, b_c) in zip(forward[warmup:], backward[: m * v - warmup], strict=True):
            row += [F(f_c * p + r, f_mb), B(b_c * p + r, b_mb)]
        row += [B(c * p + r, mb) for mb, c in backward[m * v - warmup:]]
        actions.append(row)
    return Schedule(
        actions, num_stages=p * v, num_microbatches=m, stage_to_rank=loop_placement(p, v), name="interleaved-1f1b"
    )
