"""Which rank holds each stage. Kept here (not imported from bubbleless_schedules) so partition stays
dependency-free; the rule is the same as ``bubbleless_schedules.v_placement``."""

from __future__ import annotations


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """Two chunks per rank in a V: rank i holds stages i and 2p-1-i."""
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))
