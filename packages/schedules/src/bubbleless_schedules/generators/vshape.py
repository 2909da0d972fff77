"""ZB-V, V-Half and V-Min: two chunks per rank in a V (rank i holds stages i and 2p-1-i).

All three are one search with a different memory cap (in chunk activations, 1/2 M_B each):

- ``zbv``: 2p chunks (p M_B, 1F1B's memory). With unit costs and m >= 2p: zero idle inside every
  rank's span and a whole-makespan bubble of (p-1)/(6m+p-1), the lower bound (the last rank cannot
  start before p-1 forwards). Also exact for p <= m < 2p on the whole-makespan bubble.
- ``v-half``: 2 floor((p+2)/2) chunks, i.e. floor((p+2)/2) M_B.
- ``v-min``: 2 floor((p+4)/3) chunks, i.e. floor((p+4)/3) M_B.

A ``memory_limit`` below the cap lowers it further. The candidates are the ZB-V pattern (warm-up,
steady F0 I0 W F1 I1 W, with the last W's deferred to fill the cool-down) where its p M_B fits, and
the list scheduler of ``vshape_greedy`` under several priority rules; each is timed with the given
costs (per-stage sequences, comm, cheap W) and the fastest kept, ties going to the least idle inside
the ranks' spans. See ``vshape_greedy`` for why the cap can never deadlock. Below ZB-V's cap the winner
and the leading candidates then have their cool-downs re-scheduled (``vshape_cooldown``), which meets
the controllable-memory paper's closed form at unit costs for V-Half and V-Min. At large shapes under a
tight cap (p=32, m >= 3p), where the budget allows only a few full tries, the candidates (the published
greedy, the blocks as they are and reordered) are ranked on a run of 2p micro-batches, extrapolated by
the period they settle into, and only the best-ranked is run in full (``_ranked_search``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache, partial
from itertools import accumulate, islice

from ..action import Action, Kind
from ..costs import Costs
from ..placement import v_placement
from ..registry import register
from ..schedule import Schedule
from ..simulate import simulate
from .bounds import v_memory_bound
from .local_search import adjacent_swaps, independent, schedule_evaluator, schedule_fits, shifts
from .vshape_blocks import iter_pcm_blocks, stable_block, steady_peak, v_block
from .vshape_cooldown import COOL_DOWN, COOL_DOWN_ADMITTING, DEPTHS, recooled
from .vshape_exact import exact_slot_orders
from .vshape_fixed import time_fixed_order
from .vshape_greedy import GreedyResult, Policy, v_list_schedule
from .vshape_stable import stable_greedy_orders

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
_STABLE_UP_TO = 12_400
"""Actions up to which the published greedy's orders (``vshape_stable``) are timed in full after the search
(two simulations, about 0.1 s at this size). Larger shapes under a tight cap rank the greedy with the block
candidates on a short run instead (``_ranked_fixed_recipes``), which reaches it at p=32 m=256 within the 1 s a
name may take; the other large ones (wide caps, m < 3p) have the list scheduler's candidates, faster there."""


def zbv_script(rank: int, num_ranks: int, num_microbatches: int, deferred_w: int = 0) -> list[str]:
    """The ZB-V order of one rank as tokens (``F0`` first-chunk forward, ``I1`` second-chunk
    input-gradient, ``W`` oldest pending weight-gradient): 2(p-rank)-1 first-chunk forwards, ``rank``
    pairs F1 F0, ``p-rank`` triples F1 I1 W, then F0 I0 W F1 I1 W until the forwards run out.
    The last ``deferred_w`` W tokens are dropped so those W's fill the cool-down's gaps instead."""
    p, m = num_ranks, num_microbatches
    done = {"F0": 0, "F1": 0, "I0": 0, "I1": 0}
    pending = 0
    out: list[str] = []

    def emit(token: str) -> None:
        nonlocal pending
        if token == "W":
            if pending:
                out.append(token)
                pending -= 1
            return
        chunk = token[1]
        if done[token] >= m or (token[0] == "I" and done["F" + chunk] <= done[token]):
            return
        if token == "F1" and done["F0"] <= done["F1"]:
            return
        out.append(token)
        done[token] += 1
        pending += token[0] == "I"

    for _ in range(2 * (p - rank) - 1):
        emit("F0")
    for _ in range(rank):
        emit("F1")
        emit("F0")
    for _ in range(p - rank):
        for token in ("F1", "I1", "W"):
            emit(token)
    while done["F0"] < m or done["F1"] < m:
        for token in ("F0", "I0", "W", "F1", "I1", "W"):
            emit(token)
    if deferred_w:
        w_positions = set([i for i, token in enumerate(out) if token == "W"][-deferred_w:])
        out = [token for i, token in enumerate(out) if i not in w_positions]
    return out


def zbv_formatted(rank: int, num_ranks: int, num_microbatches: int) -> list[Action]:
    """The published handcrafted ZB-V order of one rank (PyTorch/Primus ``zbv-formatted``), with each W
    naming its chunk: 2(p-r)-1 F0, r pairs F1 F0, p-r triples F1 I1 W1, steady F0 I0 W0 F1 I1 W1, a
    cool-down of r pairs I0 I1 and p-r pairs I0 W0, then the W's left, built for max(2p-1, m)
    micro-batches with the extra ones dropped. A candidate of ``zbv`` next to ``zbv_script``."""
    p, r = num_ranks, rank
    total = max(2 * p - 1, num_microbatches)
    stage = (r, 2 * p - 1 - r)
    done = dict.fromkeys(("F0", "F1", "I0", "I1", "W0", "W1"), 0)
    need = {"I": "F", "W": "I"}
    out: list[Action] = []

    def emit(*tokens: str) -> None:
        for token in tokens:
            kind, chunk = token
            k = done[token]
            if k >= total or (kind in need and done[need[kind] + chunk] <= k) or (token == "F1" and done["F0"] <= k):
                continue
            done[token] += 1
            out.append(Action(stage[int(chunk)], Kind(kind), k))

    emit(*["F0"] * (2 * (p - r) - 1))
    for _ in range(r):
        emit("F1", "F0")
    for _ in range(p - r):
        emit("F1", "I1", "W1")
    while done["F0"] < total or done["F1"] < total:
        emit("F0", "I0", "W0", "F1", "I1", "W1")
    for _ in range(r):
        emit("I0", "I1")
    for _ in range(p - r):
        emit("I0", "W0")
    while min(done.values()) < total:
        emit("I1", "I0", "W1", "W0")
    return [a for a in out if a.microbatch < num_microbatches]


def _fixed_result(p: int, m: int, rows, costs: Costs, input_grad_frees: float) -> GreedyResult:
    schedule = Schedule(rows, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
    timeline = simulate(schedule, costs, input_grad_frees=input_grad_frees)
    spans = sum(timeline.span_of(r) for r in range(p))
    return GreedyResult(schedule.actions, timeline.makespan, spans, 2 * timeline.max_peak_memory)


def _better(a: GreedyResult | None, b: GreedyResult | None) -> bool:
    if a is None:
        return False
    return b is None or (round(a.makespan, 9), round(a.span_sum, 9)) < (round(b.makespan, 9), round(b.span_sum, 9))


def _candidates(p: int, m: int, cap_chunks: float):
    """(scripts, policy) pairs, most promising first for this cap."""
    pcm = _pcm_candidates(p, m, cap_chunks)
    if cap_chunks >= 2 * p - 1e-9:
        for deferred in (1, 0, 2):
            yield [zbv_script(r, p, m, deferred) for r in range(p)], _POLICIES[0]
    else:
        yield from _stable_candidates(p, m, cap_chunks)
        yield from islice(pcm, 2)  # the shortest fitting block, reordered: what wins most tight caps
    tight = cap_chunks < p + 2  # tight caps: the repeated block beats the list scheduler
    if tight:  # the block search as the paper runs it (its W's labelled, reordered within 8): see _MIN_TRIES
        yield from _pcm_candidates(p, m, cap_chunks, labelled=True)
        yield from _block_candidate(p, m, cap_chunks)
    for policy in _POLICIES:
        yield None, policy
    if not tight:
        yield from _block_candidate(p, m, cap_chunks)
    yield from pcm
    if not tight:
        yield from _pcm_candidates(p, m, cap_chunks, labelled=True)


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


_RANKED_BUDGET = 175_000
"""Actions ``_ranked_search``'s reordered candidates and the cool-down's one try may schedule together: two
full runs (the best-ranked, then its cool-down) and as many short list-scheduled runs as the rest allows. At
p=32 that is 6 short runs at m=256, 10 at m=128 and 11 at m=97. The candidates run as they are (about 15
at p=32, timed by ``vshape_fixed`` at a third of the cost) come on top: with them the whole generation at
p=32 m=256 under limit 12 takes 0.8-0.93 s CPU on a shared machine (0.70-0.79 s before them)."""


def _ranks_candidates(p: int, m: int, cap_chunks: float) -> bool:
    """Whether the search ranks block candidates on a short run (``_ranked_search``) instead of timing
    them in full: tight caps (as in ``_candidates``) at shapes whose search budget allows only a few full
    tries (above ``_MIN_TRIES_UP_TO`` actions), with m >= 3p so the short run is at most 2/3 of a full one."""
    return cap_chunks < p + 2 and 6 * p * m > _MIN_TRIES_UP_TO and m >= 3 * p


def _ranked_fixed_recipes(p: int, m: int, cap_chunks: float):  # yields scripts_of(n)
    """The orders ``_ranked_search`` ranks as they are (timed by ``vshape_fixed``, a third of a list-scheduled
    run): the published greedy over the stable V-Half / V-Min patterns (``vshape_stable``) where they fit,
    then each fitting PCM block's repeated order, over the paper's whole search space (every split point, as
    its search runs it: at p=32 under limit 12, B-heavy costs, the fastest block's order is the ninth-shortest,
    split after 29 of 31 rank steps, which the eight evenly spread split points miss)."""
    for kind in ("v-half", "v-min"):
        if _block_peak(p, stable_block(p, kind), m) <= cap_chunks + 1e-9:
            yield partial(_greedy_tokens, p, kind=kind)
    for block, _ in _fitting_pcm_blocks(p, m, cap_chunks, max_split_values=p):
        yield partial(_tokens_of_block, p, block=block, labelled=True)


def _ranked_reordered_recipes(p: int, m: int, cap_chunks: float):
    """The PCM blocks shortest first, their W's labelled, reordered within 3 actions (the paper's reorder
    under real costs): of our candidates timed in full at p=32 m=256, the fastest in four of the seven
    profiles of bench/results/large_shapes.md (1.5B's is the greedy V-Min, B-heavy's a block as is). These
    keep the eight spread split points: they get few tries (6 at m=256, 10 at m=128), and the blocks the other
    split points add push out the ones that win reordered (comm-heavy m=128: 832.5 against 830.5)."""
    for block, own in _fitting_pcm_blocks(p, m, cap_chunks):
        yield partial(_tokens_of_block, p, block=block, labelled=True), _labelled(_PCM_POLICIES[0], cap_chunks, own)


def _greedy_tokens(p: int, m: int, kind: str) -> list[list[str]]:
    """The published greedy's orders (``vshape_stable``) as script tokens, each W naming its chunk (the
    greedy runs a chunk's W's in the order of their input-gradients, as ``W0`` / ``W1`` do)."""
    return [[f"{a.kind.value}{0 if a.stage < p else 1}" for a in row] for row in stable_greedy_orders(p, m, kind)]


def _extrapolated(short: GreedyResult, m: int) -> float:
    """The makespan ``short`` (a run of fewer micro-batches) predicts for ``m``: a repeated block settles
    into a period, read off the pace of the second half's admissions, so m - len(short.admitted) more
    micro-batches add that many periods to the same warm-up and cool-down."""
    admitted = short.admitted
    half = len(admitted) // 2
    pace = (admitted[-1] - admitted[half]) / (len(admitted) - 1 - half)
    return short.makespan + (m - len(admitted)) * pace


def _ranked_search(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float) -> GreedyResult:
    """The candidates of ``_ranked_fixed_recipes`` (all) and ``_ranked_reordered_recipes`` (as many as
    ``_RANKED_BUDGET`` allows) run for 2p micro-batches, ranked by the makespan each predicts for ``m``
    (``_extrapolated``); the best-ranked that fits is run in full. At p=32 m=256 a full try costs four short
    ones, and the budget allows two to four full tries, too few to reach the blocks that win there
    (comm-heavy: 1626.5 with the first two candidates, the stable pattern's; 1542.5 with the fourth-shortest
    fitting block, reordered; bench/results/large_shapes.md)."""
    short = max(2 * p, 4)  # at least 4: the pace needs two admissions in the second half

    def as_is(n: int, scripts) -> GreedyResult | None:
        return time_fixed_order(p, n, costs, scripts, input_grad_frees)

    def reordered(policy: Policy):
        return lambda n, scripts: v_list_schedule(p, n, costs, cap_chunks, policy, input_grad_frees, scripts)

    runs = max(1, (_RANKED_BUDGET - 2 * 6 * p * m) // (6 * p * short))
    recipes = [*((scripts_of, as_is) for scripts_of in _ranked_fixed_recipes(p, m, cap_chunks)),
               *((scripts_of, reordered(policy))
                 for scripts_of, policy in islice(_ranked_reordered_recipes(p, m, cap_chunks), runs))]
    ranked = []
    for scripts_of, run in recipes:
        result = run(short, scripts_of(short))
        if result is not None and result.peak_chunks <= cap_chunks + 1e-9:
            ranked.append((_extrapolated(result, m), len(ranked), scripts_of, run))
    for _, _, scripts_of, run in sorted(ranked, key=lambda item: item[:2]):
        result = run(m, scripts_of(m))
        if result is not None and result.peak_chunks <= cap_chunks + 1e-9:
            return result
    return v_list_schedule(p, m, costs, cap_chunks, _POLICIES[0], input_grad_frees)  # always finishes


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


@lru_cache(maxsize=32)
def search_v_schedule(
    p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float = 0.0
) -> GreedyResult:
    """The fastest order found within ``cap_chunks`` chunk activations per rank.

    Cached: under a memory limit at or below V-Min's cap, zbv, v-half and v-min search the same cap
    (``auto`` asks all three), and the registry's median re-run for per-stage costs repeats a shape."""
    costs.check_stages(2 * p)
    best: GreedyResult | None = None
    spent, per_try = 0, 6 * p * m
    budget = _SEARCH_BUDGET if per_try > 6_200 else 2 * _SEARCH_BUDGET
    if per_try <= _MIN_TRIES_UP_TO:
        budget = max(budget, _MIN_TRIES * per_try)
    leaders: list[GreedyResult] = []  # the fastest candidates, fastest first, for the cool-down step
    formatted = None
    if cap_chunks >= 2 * p - 1e-9:  # the published ZB-V order, timed with the true costs: see _FIXED_ORDERS_UP_TO
        formatted = _fixed_result(p, m, [zbv_formatted(r, p, m) for r in range(p)], costs, input_grad_frees)
        spent += per_try if per_try > _FIXED_ORDERS_UP_TO else 0
    if _ranks_candidates(p, m, cap_chunks):
        leaders.append(_ranked_search(p, m, costs, cap_chunks, input_grad_frees))
        best = leaders[0]
    for scripts, policy in () if best is not None else _candidates(p, m, cap_chunks):
        result = v_list_schedule(p, m, costs, cap_chunks, policy, input_grad_frees, scripts)
        spent += per_try
        if result is not None and result.peak_chunks <= cap_chunks + 1e-9:
            _keep_leading(leaders, result, _LEADERS)
            best = leaders[0]
        if best is not None and spent + per_try > budget:
            break  # before the next candidate is built: scripts for large shapes take time to write
    assert best is not None, "the unscripted list scheduler always finishes"
    if formatted is not None and formatted.peak_chunks <= cap_chunks + 1e-9 and _better(formatted, best):
        best = formatted
    if cap_chunks < 2 * p - 1e-9 and 6 * p * m <= _STABLE_UP_TO:
        for kind in ("v-half", "v-min"):  # the published greedy over the stable patterns, as it orders them
            greedy = _fixed_result(p, m, stable_greedy_orders(p, m, kind), costs, input_grad_frees)
            if greedy.peak_chunks <= cap_chunks + 1e-9 and _better(greedy, best):
                best = greedy
    before_cool_down = best
    if cap_chunks < 2 * p - 1e-9:
        best = _cool_down(p, m, costs, cap_chunks, input_grad_frees, best, leaders)
        if 6 * p * m <= _MIN_TRIES_UP_TO:
            best = _wide_cool_down(p, m, costs, cap_chunks, input_grad_frees, best)
    if p <= _EXACT_RANKS_UP_TO and 6 * p * m <= _EXACT_UP_TO and input_grad_frees == 0.0:
        best = _exact(p, m, costs, cap_chunks, best)
    if 6 * p * m <= _LOCAL_SEARCH_UP_TO:
        polished = _polish(p, m, costs, cap_chunks, input_grad_frees, best)
        if best is not before_cool_down:  # the swaps may go further from the order the cool-down replaced
            other = _polish(p, m, costs, cap_chunks, input_grad_frees, before_cool_down)
            polished = other if _better(other, polished) else polished
        best = polished
    return best


_LEADERS = 8
_COOL_DOWN_BUDGET = 150_000
"""The cool-down step (``vshape_cooldown``) re-schedules the winner and the ``_LEADERS`` fastest
candidates, each under two policies from eight depths, in that order, as many tries as
``_COOL_DOWN_BUDGET`` actions allow (all 144 up to p=7 m=22, 48 at p=16 m=32, about 0.5 s) and one for
shapes above 12,400 actions (0.15 s at p=32 m=256). The leaders matter: the polish reshuffles the
winner's order, and at p=7 and p=11 only a leading candidate's own order, re-cooled, meets the closed
form (at p=7 the eighth)."""


def _keep_leading(leaders: list[GreedyResult], result: GreedyResult, size: int) -> None:
    """Insert ``result`` into ``leaders`` (fastest first, earlier candidates first among equals), kept at ``size``."""
    at = next((i for i, other in enumerate(leaders) if _better(result, other)), len(leaders))
    leaders.insert(at, result)
    del leaders[size:]


_WIDE_BLOCKS = 4
_WIDE_BUDGET = 100_000
"""Actions the wide step (``_wide_cool_down``) may schedule: the ``_WIDE_BLOCKS`` shortest fitting blocks,
each reordered within p actions and re-cooled from each of ``DEPTHS``, in that order (all 36 tries up to
p=12 m=12, 27 at p=14 m=43, about 0.3 s there)."""


def _wide_cool_down(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best):
    """``best`` or a faster one from the shortest PCM blocks reordered within p actions (a window as wide
    as the pipeline), their cool-downs re-scheduled. The cool-down step re-schedules the fastest candidates
    only, and these are not among them (p=12 m=12, unit costs: 55.5 against 52.5), yet re-cooled from depth
    3 or 4 they are what meets V-Half's closed form at m = p for even p >= 12 and at p=14 m=43 (51.0 -> 50.5
    at p=12 m=12, 60.0 -> 59.5 at p=14 m=14, 69.0 -> 68.5 at p=16 m=16, 147.0 -> 146.5 at p=14 m=43)."""
    per_try, spent = 6 * p * m, 0
    wide = Policy(fill_w=False, lookahead=p)
    for block, _ in islice(_fitting_pcm_blocks(p, m, cap_chunks), _WIDE_BLOCKS):
        base = v_list_schedule(p, m, costs, cap_chunks, wide, input_grad_frees, _tokens_of_block(p, m, block))
        spent += per_try
        if base is None or base.peak_chunks > cap_chunks + 1e-9:
            continue
        for depth in DEPTHS:
            if spent + per_try > _WIDE_BUDGET:
                return best
            spent += per_try
            for result in recooled(p, m, costs, cap_chunks, input_grad_frees, base, (depth,), COOL_DOWN):
                if _better(result, best):
                    best = result
    return best


def _cool_down(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best, leaders):
    """The fastest of ``best`` and of ``best`` and ``leaders`` with their cool-downs re-scheduled
    (``vshape_cooldown.recooled``), tried in the order and number ``_COOL_DOWN_BUDGET`` describes."""
    per_try = 6 * p * m
    tries = 1 if per_try > _MIN_TRIES_UP_TO else max(1, _COOL_DOWN_BUDGET // per_try)
    plan, seen = [], []
    for base in (best, *leaders):
        if any(base.actions == other.actions for other in seen):
            continue
        seen.append(base)
        plan += [(base, policy, depth) for policy in (COOL_DOWN, COOL_DOWN_ADMITTING) for depth in DEPTHS]
    for base, policy, depth in plan[:tries]:
        for result in recooled(p, m, costs, cap_chunks, input_grad_frees, base, (depth,), policy):
            if _better(result, best):
                best = result
    return best


_EXACT_RANKS_UP_TO = 4
_EXACT_UP_TO = 800
_EXACT_BUDGET = 20_000
"""Ranks and actions up to which even unit costs also get the exhaustive slot search (``vshape_exact``),
and its budget in slot choices for the first makespan it tries (halved for each shorter one). At p=4 it
settles a question in a few thousand choices; at p=8 the budget runs out (measured at m=16: nothing
found in 10^6), so larger p is not asked."""


def _exact(p: int, m: int, costs: Costs, cap_chunks: float, best: GreedyResult) -> GreedyResult:
    """At even unit costs (one cost for every chunk pass, no comm), ask the exhaustive slot search for a
    schedule one slot shorter than the best so far, then shorter again, while it finds one in budget."""
    passes = {costs.of(kind, s, 2) for kind in (Kind.F, Kind.I, Kind.W) for s in range(2 * p)}
    if len(passes) != 1 or costs.comm != 0:
        return best
    slot = passes.pop()
    if slot <= 0:
        return best
    budget = _EXACT_BUDGET
    target = round(best.makespan / slot) - 1
    while budget > 0 and target >= 6 * m:
        rows = exact_slot_orders(p, m, cap_chunks, target, node_budget=budget)
        budget //= 2  # each shorter target is a harder question; stop before it costs more than the first
        if rows is None:
            break
        found = _fixed_result(p, m, rows, costs, 0.0)
        if found.peak_chunks > cap_chunks + 1e-9 or not _better(found, best):
            break
        best = found
        target = round(best.makespan / slot) - 1
    return best


_FIXED_ORDERS_UP_TO = 20_000
"""The published ZB-V order is timed by the simulator at every size (0.05 s at 20,000 actions, 0.3 s at
p=32 m=256); above this many actions it takes one search try's place in ``_SEARCH_BUDGET``, since there
the budget allows only two to four tries and the published order beats the scripted ones (p=32 m=128,
1.5B profile: 6264.4 against 6366.4; bench/results/large_shapes.md)."""
_LOCAL_SEARCH_UP_TO = 2_000
_LOCAL_SEARCH_BUDGET = 1.5e5
"""Actions up to which the winner is polished by adjacent swaps, then by moves of one action a few places
(``local_search.shifts``), and each search's budget in evaluated actions (about 0.1-0.2 s each)."""


def _polish(p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, best: GreedyResult):
    """Swap adjacent independent actions, then move single ones a few places, while the simulated makespan
    improves within the cap."""
    schedule = Schedule(best.actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
    rows, makespan = schedule.actions, best.makespan
    for search in (adjacent_swaps, shifts):
        rows, makespan = search(
            rows, schedule_evaluator(schedule, costs), can_swap=independent,
            fits=schedule_fits(schedule, cap_chunks / 2, input_grad_frees), best=makespan,
            budget=_LOCAL_SEARCH_BUDGET,
        )
    if makespan < best.makespan - 1e-9:
        return GreedyResult(tuple(tuple(r) for r in rows), makespan, best.span_sum, best.peak_chunks)
    return best


def _v_generator(name: str, cap_m_b, **_):
    def generate(*, num_ranks: int, num_microbatches: int, costs: Costs, memory_limit: float | None, **options):
        p, m = num_ranks, num_microbatches
        input_grad_frees = float(options.pop("input_grad_frees", 0.0))
        if options:
            raise ValueError(f"{name} takes no options {sorted(options)}; it accepts input_grad_frees only")
        cap = float(cap_m_b(p))
        if memory_limit is not None:
            cap = min(cap, float(memory_limit))
        if cap < 1.0:
            raise ValueError(
                f"{name} needs memory_limit >= 1 M_B (both chunks of one micro-batch live on the bottom rank "
                f"at once); got {memory_limit:g}"
            )
        best = search_v_schedule(p, m, costs, 2.0 * cap, input_grad_frees)
        return Schedule(best.actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p), name=name)

    generate.__name__ = name.replace("-", "_")
    generate.placement_of = v_placement  # for auto's bound and order (generators/bounds.py)
    generate.peak_of = lambda p, m: cap_m_b(p)
    generate.memory_bound_of = lambda p, m, costs, memory_limit: v_memory_bound(  # auto's pruning (bounds.py)
        p, m, costs, 2.0 * min(float(cap_m_b(p)), math.inf if memory_limit is None else float(memory_limit)))
    generate.__doc__ = f"{name}: V placement, peak at most {cap_m_b.__doc__} M_B (and memory_limit)."
    return generate


def _zbv_cap(p: int) -> int:
    """p"""
    return p


def _v_half_cap(p: int) -> int:
    """floor((p+2)/2)"""
    return (p + 2) // 2


def _v_min_cap(p: int) -> int:
    """floor((p+4)/3)"""
    return (p + 4) // 3


zbv = register("zbv")(_v_generator("zbv", _zbv_cap))
v_half = register("v-half")(_v_generator("v-half", _v_half_cap))
v_min = register("v-min")(_v_generator("v-min", _v_min_cap))
