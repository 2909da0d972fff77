"""Re-scheduling the cool-down of a V order: one more step of the V search (issue 11).

The candidates of ``vshape`` run each W soon after its input-gradient (I). In the cool-down that paces
the last micro-batches' I chains: a rank that runs B b w W per micro-batch passes the chain on once
every four slots instead of every two, and at unit costs V-Half's bubble ends 2 to 5 time units above
the controllable-memory paper's closed form b(M) (p=8 m=16: 59 against 56.5; p=16 m=32: 120.5
against 116.5). An exact slot search (CP-SAT, research only) showed that the best order's warm-up and
steady state are fine: fixing its first 78 of 118 slots at p=8 m=16 still allows 56.5. What the
optimum does differently is the cool-down: forwards and I's first, the W's deferred to fill the waits
at the end (memory allows it, since no micro-batch is admitted any more), and the last admissions made
up to the cap.

So each rank keeps its order up to its first-chunk forward of micro-batch ``m - depth`` and the list
scheduler finishes it with forwards first, then I's, W's last, admitting up to the cap (no reserved
room: a try may stall and is then dropped). Which depth wins varies with the shape (2 at p=8 and 12,
4 at p=16), so the search tries several, most often winning first, and keeps the fastest by the
simulator's rules. With it the V search meets the closed form at unit costs for V-Min at every p in
3..16 and m in {p, 2p, 3p+1}, and for V-Half there except p=14 m=43 and m = p at p = 12, 14, 16 (half
a unit above each), which ``vshape_improve._wide_cool_down`` closes: the shortest blocks reordered within
p actions, re-cooled from depth 3 or 4, though before re-cooling they are not among the fastest.
"""

from __future__ import annotations

from ..action import Kind
from ..costs import Costs
from .vshape_greedy import GreedyResult, Policy, v_list_schedule
from .vshape_resume import fixed_timing, follows_scripts_exactly, state_at_cut

COOL_DOWN = Policy(order=("F1", "F0", "I", "W"), fill_w=False, reserve=False)
COOL_DOWN_ADMITTING = Policy(order=("F0", "F1", "I", "W"), fill_w=False, reserve=False)
DEPTHS = (2, 4, 1, 3, 5, 6, 8, 7)
"""Cool-down depths (admissions re-scheduled per rank), most often winning first."""


def scripts_before_last(p: int, m: int, rows, depth: int) -> list[list[str]]:
    """Each rank's order as ``v_list_schedule`` script tokens (W's naming their chunk), cut before its
    first-chunk forward of micro-batch ``m - depth``."""
    token = {(kind, chunk): f"{kind.value}{chunk}" for kind in Kind for chunk in (0, 1)}  # named once
    forward, cut = Kind.F, m - depth
    scripts = []
    for row in rows:
        tokens: list[str] = []
        append = tokens.append
        for action in row:
            kind = action.kind
            chunk = 0 if action.stage < p else 1
            if kind is forward and chunk == 0 and action.microbatch == cut:
                break
            append(token[kind, chunk])
        scripts.append(tokens)
    return scripts


def recooled(
    p: int, m: int, costs: Costs, cap_chunks: float, input_grad_frees: float, base: GreedyResult, depths,
    policy: Policy = COOL_DOWN,
) -> list[GreedyResult]:
    """``base`` with its cool-down re-scheduled from each of ``depths`` (``COOL_DOWN``): the tries that
    finish within ``cap_chunks``. Each try goes on from the state its script reaches before any rank runs
    out of it (``vshape_resume``) instead of from time 0: same result, a fraction of the steps."""
    found, times = [], None
    if follows_scripts_exactly(policy):
        times = fixed_timing(p, m, costs, base, input_grad_frees)
    for depth in depths:
        if not 1 <= depth <= m:
            continue
        scripts = scripts_before_last(p, m, base.actions, depth)
        state = None if times is None else state_at_cut(p, m, costs, base.actions, times, scripts, input_grad_frees)
        result = v_list_schedule(p, m, costs, cap_chunks, policy, input_grad_frees, scripts, resume=state)
        if result is not None and result.peak_chunks <= cap_chunks + 1e-9:
            found.append(result)
    return found
