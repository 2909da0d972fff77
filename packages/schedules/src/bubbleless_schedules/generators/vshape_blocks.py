"""Building blocks for V schedules ("Pipeline Parallelism with Controllable Memory", Qi et al. 2024).

A building block places one micro-batch's 6p passes (F, I, W on each of the 2p chunks) on a grid of
unit slots; repeating it every 6 slots keeps every rank busy in the steady state, because each rank's
six passes take six different slots modulo 6. The block's lifespans (F to W on each chunk) set the
memory; ``turn_delay`` (slots between the last forward and the first input-gradient) lengthens them,
which buys warm-up forwards and so less bubble, at the price of memory. Sorting each rank's passes by
their slot time gives its order; executing that order as early as dependencies allow is the papers'
"squeezing".
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from itertools import permutations

from ..action import Action, Kind


def _rank_of(stage: int, p: int) -> int:
    return stage if stage < p else 2 * p - 1 - stage


def v_block(num_ranks: int, turn_delay: int = 0) -> dict[tuple[Kind, int], int]:
    """Slot times of one micro-batch's passes: ``{(kind, stage): slot}``; each pass takes the first
    slot after its inputs whose residue modulo 6 is still free on its rank."""
    p = num_ranks
    used: list[set[int]] = [set() for _ in range(p)]
    times: dict[tuple[Kind, int], int] = {}

    def place(kind: Kind, stage: int, earliest: int) -> int:
        rank = _rank_of(stage, p)
        t = earliest
        while t % 6 in used[rank]:
            t += 1
        used[rank].add(t % 6)
        times[(kind, stage)] = t
        return t

    t = -1
    for s in range(2 * p):
        t = place(Kind.F, s, t + 1)
    t += turn_delay
    for s in reversed(range(2 * p)):
        t = place(Kind.I, s, t + 1)
    for s in reversed(range(2 * p)):
        place(Kind.W, s, times[(Kind.I, s)] + 1)
    return times


def block_orders(num_ranks: int, num_microbatches: int, turn_delay: int = 0) -> list[list[Action]]:
    """Each rank's order when the block repeats every 6 slots for ``num_microbatches`` micro-batches."""
    p = num_ranks
    block = v_block(p, turn_delay)
    timed: list[list[tuple[int, int, Action]]] = [[] for _ in range(p)]
    for k in range(num_microbatches):
        for (kind, stage), t in block.items():
            timed[_rank_of(stage, p)].append((t + 6 * k, stage, Action(stage, kind, k)))
    return [[a for _, _, a in sorted(row, key=lambda x: (x[0], x[1]))] for row in timed]


def as_tokens(order: list[Action], num_ranks: int) -> list[str]:
    """An order as ``vshape_greedy`` script tokens (``F0``, ``I1``, ``W``...)."""
    return [
        "W" if a.kind is Kind.W else f"{a.kind.value}{0 if a.stage < num_ranks else 1}"
        for a in order
    ]


# -- the PCM search space: starting patterns x offsets ------------------------------------------------------
def _next_with_residue(earliest: int, residue: int) -> int:
    return earliest + (residue - earliest) % 6


def pcm_block(num_ranks: int, residues: tuple[int, int, int], steps: tuple[int, int], split: int):
    """One block of the controllable-memory paper's search, or None when it collides.

    ``residues``: rank 0's slots modulo 6 of its second-chunk forward, second-chunk input-gradient and
    first-chunk input-gradient (its first-chunk forward sits at 0). Going down the ranks, forwards and
    input-gradients of the descending half move ``steps[0]`` slots per rank for the first ``split`` rank
    steps and ``steps[1]`` after, those of the ascending half one slot; every pass takes the first slot
    of its residue after its inputs and each W the first residue still free after its input-gradient.
    Returns ``{(kind, stage): slot}`` like ``v_block``."""
    frame = _pcm_frame(num_ranks, residues, steps, split)
    return None if frame is None else _pcm_times(num_ranks, *frame)


def _pcm_frame(p: int, residues: tuple[int, int, int], steps: tuple[int, int], split: int):
    """(descending forwards, rank p-1's second-chunk forward, rank 0's second-chunk input-gradient, rank
    p-1's first-chunk input-gradient) of a block, or None when two passes of a rank share a residue: all
    a block's slots follow from these, and the collision is decided from them in O(1)."""
    down, gaps = _descending(p, steps, split)  # first-chunk forward of rank r; (down[r] + r) % 6 over r
    up_last = _next_with_residue(down[-1] + p, residues[0]) - (p - 1)  # rank p-1's second-chunk forward
    grad_first = _next_with_residue(up_last + p, residues[1])  # rank 0's second-chunk input-gradient
    grad_up_last = _next_with_residue(grad_first + down[-1] + p, residues[2]) - (p - 1)
    # A rank's four passes collide when two share a residue. First-chunk forward and second-chunk
    # input-gradient differ by grad_first on every rank, the ascending pair by grad_up_last - up_last;
    # an ascending pass (c + p - 1 - r) meets a descending one (down[r] or grad_first + down[r]) exactly
    # when its offset is in ``gaps``: checked per block in O(1), before any W is placed.
    up, grad_up = up_last + p - 1, grad_up_last + p - 1
    if grad_first % 6 == 0 or (grad_up_last - up_last) % 6 == 0:
        return None
    if {up % 6, grad_up % 6, (up - grad_first) % 6, (grad_up - grad_first) % 6} & gaps:
        return None
    return down, up_last, grad_first, grad_up_last


def _shortest_length(p: int, down, up_last: int, grad_first: int, grad_up_last: int) -> int:
    """A lower bound on the length of the block of this frame (last slot + 1): its last input-gradients
    (rank p-1's second-chunk one, rank 0's first-chunk one), each followed by its W."""
    return max(grad_first + down[-1], grad_up_last + p - 1) + 2


def _pcm_times(p: int, down, up_last: int, grad_first: int, grad_up_last: int) -> dict[tuple[Kind, int], int]:
    times: dict[tuple[Kind, int], int] = {}
    for r in range(p):  # the second-chunk input-gradient moves down the ranks as the forwards do
        f0, f1, i1, i0 = down[r], up_last + p - 1 - r, grad_first + down[r], grad_up_last + p - 1 - r
        taken = {f0 % 6, f1 % 6, i1 % 6, i0 % 6}
        s0, s1 = r, 2 * p - 1 - r
        times[(Kind.F, s0)], times[(Kind.F, s1)], times[(Kind.I, s1)], times[(Kind.I, s0)] = f0, f1, i1, i0
        _place_weight_grads(times, taken, ((s1, i1), (s0, i0)))
    return times


@lru_cache(maxsize=1024)
def _descending(p: int, steps: tuple[int, int], split: int) -> tuple[tuple[int, ...], frozenset[int]]:
    """First-chunk forward slot of each rank (``steps[0]`` per rank for the first ``split`` steps, then
    ``steps[1]``), and the residues of (slot + rank) modulo 6 over the ranks."""
    down = [0] * p
    for r in range(1, p):
        down[r] = down[r - 1] + (steps[0] if r <= split else steps[1])
    return tuple(down), frozenset((d + r) % 6 for r, d in enumerate(down))


def pcm_blocks(num_ranks: int, max_split_values: int = 8) -> list[dict[tuple[Kind, int], int]]:
    """Distinct collision-free blocks of the search space, shortest first (length = last slot + 1).

    The 60 residue patterns x steps in 1..5 x split points; above ``max_split_values`` split points
    (p > 9) only that many evenly spread ones are tried, which bounds the enumeration at large p."""
    return list(iter_pcm_blocks(num_ranks, max_split_values))


def iter_pcm_blocks(num_ranks: int, max_split_values: int = 8):
    """``pcm_blocks`` one at a time, built lazily: the frames are ordered by a lower bound on their length
    (``_shortest_length``) and a block is yielded once no unbuilt frame can be as short, so a search that
    stops after the shortest few builds only those (at p=32 building every block took 0.13 s)."""
    keys = _keys(num_ranks)
    ready: list[tuple[int, tuple[int, ...]]] = []
    seen: set[tuple[int, ...]] = set()
    for bound, frame in _pcm_frames(num_ranks, max_split_values):
        while ready and ready[0][0] < bound:
            yield dict(zip(keys, heapq.heappop(ready)[1], strict=True))
        times = _pcm_times(num_ranks, *frame)
        flat = tuple(times[k] for k in keys)
        if flat not in seen:
            seen.add(flat)
            heapq.heappush(ready, (max(flat) + 1, flat))
    while ready:
        yield dict(zip(keys, heapq.heappop(ready)[1], strict=True))


def _keys(p: int) -> list[tuple[Kind, int]]:
    return [(kind, s) for s in range(2 * p) for kind in (Kind.F, Kind.I, Kind.W)]


@lru_cache(maxsize=16)
def _pcm_frames(p: int, max_split_values: int) -> tuple[tuple[int, tuple], ...]:
    """(length bound, frame) of every collision-free point of the search space, by bound (then by the
    order of enumeration, which only decides the order of building, not of yielding)."""
    splits = list(range(1, max(2, p)))
    if len(splits) > max_split_values:
        splits = sorted({splits[round(i * (len(splits) - 1) / (max_split_values - 1))] for i in range(max_split_values)})
    found = []
    patterns = list(permutations(range(1, 6), 3))
    for a in range(1, 6):
        for b in range(1, 6):
            for split in splits if a != b else splits[:1]:
                for residues in patterns:
                    frame = _pcm_frame(p, residues, (a, b), split)
                    if frame is not None:
                        found.append((_shortest_length(p, *frame), len(found), frame))
    found.sort(key=lambda item: item[:2])
    return tuple((bound, frame) for bound, _, frame in found)


def stable_block(num_ranks: int, kind: str) -> dict[tuple[Kind, int], int]:
    """The stable V-Min / V-Half pattern of the paper's greedy as a block: on rank i, V-Min runs F0 at i,
    F1 at 2p-i-1, I1 at 2p+d+i, I0 at 4p+d-i-1 (d = 2 if p%3==0 else 0); V-Half F0 at 2i, F1 at
    3p-i-2, I1 at 3p+d+2i-1, I0 at 6p+d-i-2 (d = 3 if p is even else 0); each W the first residue
    still free after its input-gradient."""
    p = num_ranks
    times: dict[tuple[Kind, int], int] = {}
    for r in range(p):
        if kind == "v-min":
            d = 2 if p % 3 == 0 else 0
            f0, f1, i1, i0 = r, 2 * p - r - 1, 2 * p + d + r, 4 * p + d - r - 1
        else:
            d = 3 if p % 2 == 0 else 0
            f0, f1, i1, i0 = 2 * r, 3 * p - r - 2, 3 * p + d + 2 * r - 1, 6 * p + d - r - 2
        s0, s1 = r, 2 * p - 1 - r
        times[(Kind.F, s0)], times[(Kind.F, s1)], times[(Kind.I, s1)], times[(Kind.I, s0)] = f0, f1, i1, i0
        taken = {f0 % 6, f1 % 6, i1 % 6, i0 % 6}
        _place_weight_grads(times, taken, ((s1, i1), (s0, i0)))
    return times


def _place_weight_grads(times: dict, taken: set[int], after_input_grads) -> None:
    """Each stage's W in the first slot after its I whose time mod 6 no other action of the block takes."""
    for stage, after in after_input_grads:
        t = after + 1
        while t % 6 in taken:
            t += 1
        taken.add(t % 6)
        times[(Kind.W, stage)] = t


def steady_peak(num_ranks: int, block: dict[tuple[Kind, int], int]) -> int:
    """The most chunk activations a rank holds while ``block`` repeats every 6 slots without end (each F
    holds one until its stage's W): at slot t a chunk holds the micro-batches k with F + 6k <= t < W + 6k,
    and the count depends on t modulo 6 only.

    It bounds the peak of any finite repetition from above (those micro-batches are a subset) and equals
    that of one of at least ``length // 6 + 2`` micro-batches (``length`` = last slot + 1): at the first F
    slot at or after ``length`` every micro-batch a chunk holds has an index in 0..length // 6 + 1."""
    p = num_ranks
    worst = 0
    for r in range(p):
        spans = [(block[(Kind.F, s)], block[(Kind.W, s)]) for s in (r, 2 * p - 1 - r)]
        for t in range(6):
            worst = max(worst, sum((t - f) // 6 - (t - w) // 6 for f, w in spans))
    return worst
