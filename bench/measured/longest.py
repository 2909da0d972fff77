"""The longest-sequence search: the longest sequence whose probe fits the memory budget, on a grid of
``longest_granularity`` tokens, found in few probes because each probe is costly (a step in fresh
processes: tens of seconds near the boundary on this machine, quadratic in the sequence past it).

The answer is the same as a bisection's to the same tolerance: a grid length that fits whose next grid
length fails (or the cap). Only the choice of the next length differs: it is read off the peaks the
probes measured (peak memory grows smoothly with the sequence), not halved blindly:

- before any probe failed: the line through the two longest fitting probes, extended to the budget
  but at most ``MAX_STRIDE`` x the longest fit (the first step, with one point only, goes to
  ``FIRST_STRIDE`` x the shortest length; without peaks, doubling). Growth is convex in the sequence
  (attention and logits), so the extension lands a little past the boundary;
- once a probe failed: the chord between the longest fit and the shortest failure, at the budget (it
  lands a little short of the boundary, for the same reason);
- when two probes in a row moved the same end, the chord with the other end's peak pulled towards the
  budget (``illinois``), as the chord alone can creep up on the boundary from one side;
- bisection where neither can be read (a failure without a peak: the probe crashed or ran out of
  memory; peaks not increasing with the sequence).

Every length is rounded to the grid and kept strictly inside the bracket, so each probe narrows it.
Pure: ``probe_fn(seq_len) -> {"fits": bool, "peak_growth_bytes": int (optional)}`` is injected.
"""

from __future__ import annotations

FIRST_STRIDE = 8
"""The second probe's length over the first's (``longest_low``): long enough that the two peaks differ by
far more than their noise (at 2x they differ by a few MiB), short enough to be cheap."""

MAX_STRIDE = 4
"""The most a probe before the first failure extends the longest fit (two doublings): a line through
noisy peaks can point far past the boundary, and a probe there is the costliest of all."""


def on_grid(seq: float, granularity: int) -> int:
    """The multiple of ``granularity`` nearest ``seq``."""
    return int(round(seq / granularity)) * granularity


def at_budget(a: tuple[int, float], b: tuple[int, float], budget: float) -> float | None:
    """Where the line through (seq, peak) points ``a`` and ``b`` reaches ``budget``; None when the peaks
    do not grow with the sequence (noise, or a point without a peak)."""
    (sa, pa), (sb, pb) = a, b
    if pa is None or pb is None or sa == sb or (pb - pa) / (sb - sa) <= 0:
        return None
    return sa + (budget - pa) * (sb - sa) / (pb - pa)


def illinois(fit: tuple[int, float], fail: tuple[int, float | None], budget: float, same_end_moves: int,
             last_end: str) -> tuple[tuple[int, float], tuple[int, float | None]]:
    """The chord's two ends, the one kept while the other moved twice or more in a row weighed down (its
    distance from the budget halved per further move: the Illinois rule), so that the chord, which on
    a convex curve keeps landing just short of the boundary, reaches past it and brings the far end in."""
    (sa, pa), (sb, pb) = fit, fail
    if pa is None or pb is None or same_end_moves < 2:
        return fit, fail
    shrink = 0.5 ** (same_end_moves - 1)
    if last_end == "low":
        return fit, (sb, budget + (pb - budget) * shrink)
    return (sa, budget - (budget - pa) * shrink), fail


def next_length(fits: list[tuple[int, float]], fails: list[tuple[int, float | None]], *, budget: float,
                low: int, cap: int, granularity: int, same_end_moves: int = 0, last_end: str = "low") -> int:
    """The next length to probe, given the probes so far (``fits`` and ``fails``: (seq, peak) each, in
    order of length) and how many probes in a row moved the same end (``last_end``) of the bracket."""
    lo = fits[-1][0]
    hi = fails[0][0] if fails else None
    if hi is None:
        if len(fits) == 1:
            guess = FIRST_STRIDE * low
        else:
            guess = at_budget(fits[-2], fits[-1], budget)
            guess = 2 * lo if guess is None else min(guess, MAX_STRIDE * lo)
        return min(cap, max(on_grid(guess, granularity), (lo // granularity + 1) * granularity))
    guess = at_budget(*illinois(fits[-1], fails[0], budget, same_end_moves, last_end), budget)
    guess = (lo + hi) / 2 if guess is None else guess
    inside_low, inside_high = (lo // granularity + 1) * granularity, ((hi - 1) // granularity) * granularity
    return min(inside_high, max(inside_low, on_grid(guess, granularity)))


def search(probe_fn, *, budget: float, low: int, cap: int, granularity: int) -> dict:
    """``{"max_seq_len", "probes"[, "capped"]}``: the longest grid length in [low, cap] that fits with the
    next failing (module docstring); 0 when ``low`` does not fit."""
    probes, fits, fails = [], [], []
    same_end, last_end = 0, None

    def run(seq: int) -> bool:
        result = probe_fn(seq)
        probes.append(result)
        point = (seq, result.get("peak_growth_bytes"))
        (fits if result["fits"] else fails).append(point)
        fits.sort()
        fails.sort()
        return result["fits"]

    if not run(low):
        return {"max_seq_len": 0, "probes": probes}
    if low >= cap:  # nothing longer may be probed
        return {"max_seq_len": low, "probes": probes, "capped": True}
    while not fails or fails[0][0] - fits[-1][0] > granularity:
        seq = next_length(fits, fails, budget=budget, low=low, cap=cap, granularity=granularity,
                          same_end_moves=same_end, last_end=last_end)
        had_bracket = bool(fails)
        end = "low" if run(seq) else "high"
        if not fails and seq == cap:
            return {"max_seq_len": cap, "probes": probes, "capped": True}
        same_end = same_end + 1 if had_bracket and end == last_end else (1 if had_bracket else 0)
        last_end = end
    return {"max_seq_len": fits[-1][0], "probes": probes}
