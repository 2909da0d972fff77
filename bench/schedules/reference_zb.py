"""Megatron-LM's interleaved 1F1B, written from its description; the ZB entries of this file are retired.

This file used to hold our first re-implementations of the zero-bubble references: a ``zb`` greedy with a
FIXED warm-up and strict I/F alternation (weaker than sail-sg's heuristic, which is why the comparison did
not catch ours being up to 18% slower -- issue 11) and the handcrafted ZB-H1/H2. They are replaced by
``bench/schedules/published_zb.py`` (sail-sg's heuristic with its three flags under the memory limit, and
the handcrafted H1/H2 from the reference page); ``REFERENCE`` here keeps only ``interleaved-1f1b``.

Every callable is ``fn(*, num_ranks, num_microbatches, costs, memory_limit) -> Schedule``.
"""

from __future__ import annotations

from bubbleless_schedules import Action, Costs, Kind, Schedule, loop_placement


def _schedule(rows, p: int, m: int, name: str, chunks: int = 1) -> Schedule:
    return Schedule(rows, num_stages=p * chunks, num_microbatches=m, stage_to_rank=loop_placement(p, chunks), name=name)


# -- Megatron interleaved ------------------------------------------------------------------------------------
def reference_interleaved_1f1b(
    *, num_ranks: int, num_microbatches: int, costs: Costs = None, memory_limit=None, chunks: int = 2
) -> Schedule:
    p, m, v = num_ranks, num_microbatches, chunks
    if m % p:
        raise ValueError(f"Megatron's interleaved schedule needs num_microbatches a multiple of {p}")
    total = m * v

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k % (p * v)) // p
        return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk)

    rows = []
    for r in range(p):
        warmup = min(total, 2 * (p - r - 1) + (v - 1) * p)
        row = []
        for k in range(warmup):
            mb, c = unit(k, False)
            row.append(Action(c * p + r, Kind.F, mb))
        for k in range(total - warmup):
            mb, c = unit(warmup + k, False)
            row.append(Action(c * p + r, Kind.F, mb))
            mb, c = unit(k, True)
            row.append(Action(c * p + r, Kind.B, mb))
        for k in range(total - warmup, total):
            mb, c = unit(k, True)
            row.append(Action(c * p + r, Kind.B, mb))
        rows.append(row)
    return _schedule(rows, p, m, "ref-interleaved-1f1b", v)


REFERENCE = {
    "interleaved-1f1b": reference_interleaved_1f1b,
}
