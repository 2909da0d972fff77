"""Ratios of two systems' tokens/s, paired round by round.

Each round runs every system back to back, so a round's ratio compares two systems under about the same
machine load. Pooling every timed step of every round into one median per system does not: on a
shared machine whose load swings 2x between rounds, the pooled medians depend on which rounds happened
to be loaded for which system, and their quotient can say 1.2x where every round says about 1.0x. So
with more than one round the ratio is the median of the per-round ratios, and their spread goes with it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedRatio:
    """``ours`` over ``base`` tokens/s: the median of the per-round ratios and their spread."""

    median: float
    low: float
    high: float
    quartiles: tuple[float, float]
    rounds: int

    def text(self) -> str:
        """``0.97x (0.69-1.47)``: the median, then min-max over the rounds (just the median for one round)."""
        if self.rounds < 2:
            return f"{self.median:.2f}x"
        return f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f})"


def per_round(row: dict) -> dict[int, float]:
    """Round index -> that round's median tokens/s. Runs without ``round_of_run`` (records written before
    it) are taken in order, which is their round order when no round failed."""
    values = row.get("per_round_tokens_per_s") or []
    rounds = row.get("round_of_run") or list(range(len(values)))
    return dict(zip(rounds, values, strict=True))


def paired_ratio(systems: dict, ours: str, base: str) -> PairedRatio | None:
    """``ours`` over ``base``, paired by round; None when the two share no round with figures."""
    mine, theirs = per_round(systems.get(ours, {})), per_round(systems.get(base, {}))
    ratios = [mine[r] / theirs[r] for r in sorted(set(mine) & set(theirs)) if theirs[r] > 0]
    if not ratios:
        return None
    if len(ratios) == 1:
        quartiles = (ratios[0], ratios[0])
    else:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        quartiles = (q1, q3)
    return PairedRatio(statistics.median(ratios), min(ratios), max(ratios), quartiles, len(ratios))
