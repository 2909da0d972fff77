"""bench/measured/longest.py: the longest-sequence search finds the boundary of a fake system whose
limit is known, in fewer probes than doubling and bisection, and never probes a length twice."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured.longest import MAX_STRIDE, search  # noqa: E402

MIB = 2**20
BUDGET = 1024 * MIB


def fake_system(fixed_mib: float, per_token_mib: float, per_token2_mib: float, *, with_peaks: bool = True):
    """A probe whose peak is ``fixed + a s + b s^2`` MiB at ``s`` tokens (convex, as attention and logits
    make real peaks), and the lengths it was asked for."""
    asked = []

    def probe(seq: int) -> dict:
        asked.append(seq)
        peak = (fixed_mib + per_token_mib * seq + per_token2_mib * seq**2) * MIB
        out = {"seq_len": seq, "fits": peak <= BUDGET}
        if with_peaks:
            out["peak_growth_bytes"] = peak
        return out

    return probe, asked


def known_limit(fixed_mib, per_token_mib, per_token2_mib, granularity, low=128, cap=16384):
    """The answer by brute force: the longest grid length (or ``low``) whose peak is within the budget."""
    grid = [low] + list(range(granularity * (low // granularity + 1), cap, granularity)) + [cap]
    fitting = [s for s in grid if fixed_mib + per_token_mib * s + per_token2_mib * s**2 <= 1024]
    return max(fitting, default=0)


def doubling_and_bisection_probes(limit: int, *, low=128, cap=16384, granularity=256) -> int:
    """How many probes the previous search (double from ``low``, then halve the bracket) needed."""
    count, lo = 1, low
    hi = None
    while hi is None:
        nxt = min(2 * lo, cap)
        count += 1
        if nxt <= limit and nxt != cap:
            lo = nxt
        else:
            hi = nxt
    return count + max(0, math.ceil(math.log2((hi - lo) / granularity)))


SYSTEMS = [  # (fixed, per token, per token^2) MiB: shaped like the tiny scenario's probes, and extremes
    (180, 0.17, 2e-6), (160, 0.15, 0.0), (390, 0.17, 5e-6), (290, 0.22, 4e-5), (100, 0.01, 0.0), (900, 0.3, 0.0)]


@pytest.mark.parametrize("shape", SYSTEMS)
@pytest.mark.parametrize("granularity", [128, 256, 512])
def test_cross_bench_measured_longest_finds_the_known_limit_in_fewer_probes(shape, granularity):
    probe, asked = fake_system(*shape)
    found = search(probe, budget=BUDGET, low=128, cap=16384, granularity=granularity)
    assert found["max_seq_len"] == known_limit(*shape, granularity), (found, asked)
    assert len(asked) == len(set(asked)) == len(found["probes"]), asked
    if found["max_seq_len"] not in (0, 16384):
        next_on_grid = (found["max_seq_len"] // granularity + 1) * granularity
        results = {r["seq_len"]: r["fits"] for r in found["probes"]}
        assert results.get(next_on_grid) is False, asked
        before = doubling_and_bisection_probes(found["max_seq_len"], granularity=granularity)
        # fewer probes where the limit is thousands of tokens (the costly probes); one more at worst
        # where it is within FIRST_STRIDE x low, as the second probe then overshoots
        assert len(asked) < before if found["max_seq_len"] >= 2048 else len(asked) <= before + 1, asked
    longest_fit = 128
    for result in found["probes"][1:]:  # before the first failure none reaches past MAX_STRIDE x the longest fit
        assert result["seq_len"] <= max(8 * 128, MAX_STRIDE * longest_fit), asked
        if not result["fits"]:
            break
        longest_fit = result["seq_len"]


@pytest.mark.parametrize("shape", SYSTEMS)
def test_cross_bench_measured_longest_without_peaks_doubles_and_bisects_to_the_same_limit(shape):
    probe, asked = fake_system(*shape, with_peaks=False)
    found = search(probe, budget=BUDGET, low=128, cap=16384, granularity=256)
    assert found["max_seq_len"] == known_limit(*shape, 256) and len(asked) == len(set(asked)), asked


def test_cross_bench_measured_longest_at_the_ends_of_the_range():
    assert search(lambda s: {"fits": False}, budget=BUDGET, low=128, cap=8192, granularity=64)["max_seq_len"] == 0
    capped = search(lambda s: {"fits": True}, budget=BUDGET, low=128, cap=8192, granularity=64)
    assert capped["max_seq_len"] == 8192 and capped["capped"]
    asked = []
    one = search(lambda s: asked.append(s) or {"fits": True}, budget=BUDGET, low=512, cap=512, granularity=64)
    assert one["max_seq_len"] == 512 and one["capped"] and asked == [512]  # one probe, not the same one twice


def test_cross_bench_measured_longest_with_noisy_peaks_still_ends_on_a_fit_next_to_a_failure():
    """Peaks off the smooth curve by +-8% (what RSS does run to run) mislead the guesses, not the answer:
    it is a probed fit whose next grid length was probed and failed."""
    import random

    rng = random.Random(0)
    for _ in range(50):
        noise = {}

        def probe(seq, noise=noise):
            noise.setdefault(seq, 1 + rng.uniform(-0.08, 0.08))
            peak = (180 + 0.17 * seq + 2e-6 * seq**2) * noise[seq] * MIB
            return {"seq_len": seq, "fits": peak <= BUDGET, "peak_growth_bytes": peak}

        found = search(probe, budget=BUDGET, low=128, cap=16384, granularity=256)
        results = {p["seq_len"]: p["fits"] for p in found["probes"]}
        assert results[found["max_seq_len"]] and results[found["max_seq_len"] + 256] is False, results
        assert len(found["probes"]) == len(results) <= 11, results


@pytest.mark.parametrize(("name", "peak_mib"), [
    ("a jump", lambda s: 300 + 0.2 * s + (400 if s > 1900 else 0)),  # as round-robin's recorded peaks do near 2,048
    ("exponential", lambda s: 100 * 2 ** (s / 2000)),
    ("quadratic", lambda s: 100 + 1e-5 * s * s),
])
def test_cross_bench_measured_longest_on_curves_the_chord_misjudges(name, peak_mib):
    """Where the chord keeps landing on one side (strongly convex, a jump), the Illinois rule still
    ends on the known limit in no more probes than doubling and bisection."""
    def probe(seq):
        return {"seq_len": seq, "fits": peak_mib(seq) <= 1024, "peak_growth_bytes": peak_mib(seq) * MIB}

    found = search(probe, budget=BUDGET, low=128, cap=16384, granularity=256)
    limit = max(s for s in [128, *range(256, 16385, 256)] if peak_mib(s) <= 1024)
    assert found["max_seq_len"] == limit, found
    assert len(found["probes"]) <= doubling_and_bisection_probes(limit), [p["seq_len"] for p in found["probes"]]
