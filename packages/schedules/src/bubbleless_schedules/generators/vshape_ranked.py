"""The V search at large shapes under a tight cap (p=32, m >= 3p), where the search budget allows only a few
full tries: the candidates (the published greedy, the blocks as they are and reordered) are ranked on a run
of 2p micro-batches, extrapolated by the period they settle into, and only the best-ranked is run in full.
"""

from __future__ import annotations

from functools import partial
from itertools import islice

from ..costs import Costs
from .vshape_blocks import stable_block
from .vshape_candidates import (
    _MIN_TRIES_UP_TO,
    _PCM_POLICIES,
    _POLICIES,
    _block_peak,
    _fitting_pcm_blocks,
    _labelled,
    _tokens_of_block,
)
from .vshape_fixed import time_fixed_order
from .vshape_greedy import GreedyResult, Policy, v_list_schedule
from .vshape_stable import stable_greedy_orders

_RANKED_BUDGET = 175_000
"""Actions ``_ranked_search``'s reordered candidates and the cool-down's one try may schedule together: two
full runs (the best-ranked, then its cool-down) and as many short list-scheduled runs as the rest allows. At
p=32 that is 6 short runs at m=256, 10 at m=128 and 11 at m=97. The candidates run as they are (about 15
at p=32, timed by ``vshape_fixed`` at a third of the cost) come on top: with them the whole generation at
p=32 m=256 under limit 12 takes 0.8-0.93 s CPU on a shared machine (0.70-0.79 s before them)."""


def _ranks_candidates(p: int, m: int, cap_chunks: float) -> bool:
    """Whether the search ranks block candidates on a short run (``_ranked_search``) instead of timing
    them in full: tight caps (as in ``vshape._candidates``) at shapes whose search budget allows only a few
    full tries (above ``_MIN_TRIES_UP_TO`` actions), with m >= 3p so the short run is at most 2/3 of a full one."""
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

    def as_is(n: int, scripts) -> GreedyResult | None:  # the full run keeps its times for the cool-down
        times = [[] for _ in range(p)] if n == m else None
        return time_fixed_order(p, n, costs, scripts, input_grad_frees, times=times)

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
