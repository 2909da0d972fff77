"""The candidate orders of the V search (``vshape.search_v_schedule``): the list scheduler's priority rules,
the greedy's stable patterns, the repeated building blocks and the controllable-memory paper's PCM blocks,
as ``vshape_greedy`` scripts (one token list per rank) with the policy each runs under, plus the peak a
block's repeated order reaches, read without building it.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

from ..action import Kind
from .vshape_blocks import iter_pcm_blocks, stable_block, steady_peak, v_block
from .vshape_greedy import Policy

_POLICIES = (
    Policy(order=("I", "F1", "F0", "W")),
    Policy(order=("I", "F1", "W", "F0")),
    Policy(order=("F1", "I", "F0", "W")),
    Policy(order=("I", "F1", "F0", "W"), reserve_all=True),
    Policy(order=("I", "F1", "W", "F0"), patience=0.5),
    Policy(order=("F1", "F0", "I", "W")),
    Policy(order=("I", "W", "F1", "F0")),
    Policy(order=("I", "F1", "F0", "W"), patience=1.0),
)
_FIXED_ORDER = Policy(fill_w=False)
_SEARCH_BUDGET = 100_000
"""Actions the search may schedule in all (one try at p=32, m=256 schedules 49k in about 0.15 s), so
large shapes try only the first candidates; shapes of up to 6,200 actions (p=32 m=32, p=16 m=64) get
twice as much (0.6 s at most), which lets every PCM block as short as the twelfth fitting one be tried.
Shapes of up to ``_MIN_TRIES_UP_TO`` actions (p=32 at m <= 64) try at least ``_MIN_TRIES`` candidates
(about 3 s at p=32 m=64): at p=32 m=32 and m=64 a short PCM block with its W's labelled, reordered within
8 actions, is what the block-search reference wins with (comm-heavy v-min, m=32: 294.5 against our 295.5
before, from the third-shortest block; W-light m=64 reordered within 3), so tight caps try those right
after the first blocks."""
_MIN_TRIES = 40
_MIN_TRIES_UP_TO = 12_400


_PCM_POLICIES = (
    Policy(fill_w=False, lookahead=3),
    Policy(fill_w=False, lookahead=8),
    _FIXED_ORDER,
    Policy(lookahead=3),
)
"""How a PCM block's order is run: reordered within 3 or 8 actions (the paper's reorder step under
real costs), as is (its squeeze), and reordered with deferred W's filling waits."""
_PCM_BLOCKS_TRIED = 12


def _stable_candidates(p: int, m: int, cap_chunks: float):
    """The greedy's stable V-Half and V-Min patterns (``vshape_blocks.stable_block``) where they fit,
    the one with more memory first (less bubble), each with deferred W's filling waits and as is."""
    for kind in ("v-half", "v-min"):
        block = stable_block(p, kind)
        if _block_peak(p, block, m) > cap_chunks + 1e-9:
            continue
        tokens = _tokens_of_block(p, m, block)
        yield tokens, _POLICIES[0]
        yield tokens, _FIXED_ORDER


def _pcm_candidates(p: int, m: int, cap_chunks: float, labelled: bool = False):
    """The controllable-memory paper's building-block search (``vshape_blocks.pcm_blocks``): the
    shortest blocks whose repeated order fits ``cap_chunks``, each run under ``_PCM_POLICIES``; with
    ``labelled``, only each block with its W's naming their chunk, reordered within 3 and 8 actions
    (early for tight caps, where the paper's search wins with them; last otherwise, so the search budget of
    large shapes is spent on the rest first)."""
    for block, own in _fitting_pcm_blocks(p, m, cap_chunks):
        if not labelled:
            tokens = _tokens_of_block(p, m, block)
            for policy in _PCM_POLICIES:
                yield tokens, policy
                if policy.lookahead > 1 and own < cap_chunks - 1e-9:
                    yield tokens, replace(policy, lookahead_cap=own)
        else:  # the block's own W's, reordered as the paper's search does
            tokens = _tokens_of_block(p, m, block, labelled=True)
            for policy in _PCM_POLICIES[:2]:
                yield tokens, _labelled(policy, cap_chunks, own)


def _labelled(policy: Policy, cap_chunks: float, own: int) -> Policy:
    """``policy`` for a block with labelled W's: reordered within the block's own peak (and the cap)."""
    return replace(policy, lookahead_cap=min(cap_chunks, own))


def _fitting_pcm_blocks(p: int, m: int, cap_chunks: float, max_split_values: int = 8):
    """(block, its peak at ``m`` micro-batches, at least 2) for the ``_PCM_BLOCKS_TRIED`` shortest PCM blocks
    whose repeated order fits ``cap_chunks``, and every other block as short as the last of them, from the
    search space with ``max_split_values`` split points (``vshape_blocks.pcm_blocks``)."""
    tried, last_length = 0, None
    for block in iter_pcm_blocks(p, max_split_values):
        length = max(block.values()) + 1
        if tried >= _PCM_BLOCKS_TRIED and length != last_length:
            return  # all blocks as short as the last one tried are tried: their order is arbitrary
        if _block_peak(p, block, min(m, length // 6 + 2)) > cap_chunks + 1e-9:
            continue
        yield block, max(2, _block_peak(p, block, m))
        tried, last_length = tried + 1, length


def _block_candidate(p: int, m: int, cap_chunks: float):
    """Repeated building blocks (``vshape_blocks``) whose peak fits: the longest turn delays first
    (most warm-up), each as a fixed order and with deferred W's filling its waits. Peaks are read off
    a short run (the steady state is reached within a lifespan); the search re-checks the real one."""
    fitting = []
    for delay in range(6 * p):
        short = min(m, 2 * p + delay // 6 + 2)
        peak = max(_peak_chunks(tokens) for tokens in block_tokens(p, short, delay))
        if peak <= cap_chunks + 1e-9:
            fitting.append(delay)
        elif fitting and peak > cap_chunks + 2:
            break
    for delay in [*reversed(fitting[-3:]), *fitting[:1]]:
        block = block_tokens(p, m, delay)
        yield block, _FIXED_ORDER
        yield block, _POLICIES[0]


def block_tokens(p: int, m: int, delay: int) -> list[list[str]]:
    """``[as_tokens(order, p) for order in block_orders(p, m, delay)]`` without building an ``Action``
    per pass: each rank's six passes sit at distinct slots modulo 6, so their repeats never tie and
    sorting the slot numbers alone gives the order (tests/test_sched_speed.py checks the equality)."""
    return _tokens_of_block(p, m, v_block(p, delay))


def _tokens_of_block(p: int, m: int, block: dict, labelled: bool = False) -> list[list[str]]:
    """Each rank's order of the repeated block as script tokens; ``labelled``: a W names its chunk
    (``W0``/``W1``) as the block places it, instead of running the oldest pending W."""
    by_slot: list[dict[int, str]] = [{} for _ in range(p)]
    for (kind, stage), slot in block.items():
        chunk = 0 if stage < p else 1
        token = (f"W{chunk}" if labelled else "W") if kind is Kind.W else f"{kind.value}{chunk}"
        row = by_slot[stage if stage < p else 2 * p - 1 - stage]
        for k in range(m):
            row[slot + 6 * k] = token
    return [[row[slot] for slot in sorted(row)] for row in by_slot]


def _block_peak(p: int, block: dict, m: int) -> int:
    """The most chunk activations a rank holds in the block's order repeated for ``m`` micro-batches: the
    steady state's from ``length // 6 + 2`` on (``vshape_blocks.steady_peak``, no order built: the search
    checks hundreds of blocks at p=32), the order's own count below."""
    if m >= (max(block.values()) + 1) // 6 + 2:
        return steady_peak(p, block)
    return max(_peak_chunks(row) for row in _tokens_of_block(p, m, block))


_CHUNKS_HELD = {"F0": 1, "F1": 1, "I0": 0, "I1": 0, "W": -1, "W0": -1, "W1": -1}
"""What each script token adds to a rank's chunk activations (I frees nothing: an upper bound)."""


def _peak_chunks(tokens: list[str]) -> int:
    return max(accumulate(map(_CHUNKS_HELD.__getitem__, tokens), initial=0))
