"""``roundrobin`` with per-layer costs: the cut and the dispatch chosen together by the simulator.

Every candidate cut (``roundrobin_cut.candidate_cuts``, or the one cut the options pin) is dispatched by
the list scheduler (``roundrobin_dispatch``) with recompute running at most 1 micro-batch ahead, and where
its fused group is slower per micro-batch than every other job (``fused_devices``: the LM head against
the fine cuts' one-layer groups) also with that group split interleaved over as many devices as keep it
from pacing, so a cut of many short jobs is judged as it would run; the ``FINALISTS`` best (cut, split)
also with 2 ahead and with the device's next job recomputing in the current
job's waits (``next_ahead``; not when the options pin ``recompute_ahead``, which bounds what a device
recomputes before its backward). The list scheduler's own makespans rank them; unless the options pin
the cut, the best one's cut is then refined by a local search under the same look-ahead
(``roundrobin_refine``: single-layer moves between groups, merges and splits; under the best plan's
fused-group split, and then from the best unsplit plan too when those differ). From the best unsplit
plan, jobs are then split over devices (a split job LOADs its weights and STOREs its partial gradients
on each of its devices): the pacing jobs over two (``pacing_jobs``: the fused last group and the job with
the most work; halves or interleaved, ``roundrobin_dispatch.SPLITS``), and larger fused groups
(``grown_fused``: less recompute; every size one layer apart up to the weight limit, then shares of the
model) over as many devices as keep them from pacing (and, in a branch of its own, when the best plan's only
split is its fused group's, that plan's cut with one more fused layer under the same split and its drain's
``TAIL_SPLITS``, then that cut's forward groups evened into one more under each fill split and the
other drain, kept when faster and no idler back to back: ``grown_sources``, ``evened_forward``, a few
dispatches beyond the budget, its best judged beside the main branch's, both winners tried with I and
W), and then, from the best of those, the backward
jobs that run last (the drain, ``TAIL_SPLITS``: each waits for the gradient of the one before it, so
their ends stagger by a micro-batch each) over two or four devices each, then the forward jobs that run
first (the fill, ``FILL_SPLITS``: device d starts when micro-batch 0 has passed the d jobs before it) over
two or four, and a second local search moves layers under that whole job split (``SPLIT_REFINE_BUDGET``;
its plan, or a fill split's, is kept only when faster and no idler back to back: ``no_idler_than``), then
the drain's very last job over every device on top of the best plan's split (``widest_drain``: the devices
end together; kept on the same terms), all within
``weight_limit`` layers of weights per device (default: what the best unsplit plan holds), counted
as the pool holds them (``held_weights``: a device may end a later-started job first, the pool then
prefetches its next job into the room it leaves), and refused when a device would need three jobs'
weights at once. The best ``FINALISTS`` and the best unsplit plan, weight transfers inserted, are simulated under
the per-job costs the layer costs sum to (LOAD/STORE included), and the fastest within ``memory_limit``
wins (the first on a tie, so the result is deterministic). With ``objective="period"`` the simulator
judges these finalists by their steady-state period instead (``roundrobin_judge.OBJECTIVES``); the ranking before it is
the list scheduler's makespan either way.

Split backward (``split_backward``): True searches with every gradient job's B dispatched as I and W
(``roundrobin_dispatch``), False with B. None (the generator's default) searches with B, then dispatches
the winner's cut and job split with I and W under every look-ahead; the list scheduler's best of those
(W ends a job late, so a device may end the next job's early recompute first: allowed within two jobs'
weights) is simulated and replaces the B plan only when it runs faster (B on a tie). When the B
search finished with at least ``LEFTOVER_SEARCH`` of its budget unspent, a whole I/W search follows in
what is left, within the weights the B plan holds, and its plan wins only when it simulates faster.
So the default is never slower than B and costs at most one search's budget (two whole searches take
~2 s per call at the sizes of ``bench.schedules.roundrobin_table``; two at half budget each would fit
but lose the guarantee, and gained 1-3% on four of its ten rows, lost 1% on two). A
search under I/W alone can be far worse than B: its own best unsplit plan sets a weight limit that may
exclude the large fused group split over devices that B finds. I and W count as two actions against
``SEARCH_BUDGET``, so a split search dispatches about as much as a B one.
"""

from __future__ import annotations

import math

from ..costs import Costs
from ..roundrobin_layout import PoolGroups, held_weights
from ..schedule import Schedule
from ..simulate import peak_memory
from . import roundrobin_refine
from .roundrobin_cut import candidate_cuts, job_costs, with_last
from .roundrobin_dispatch import SPLITS, JobTimes, list_dispatch, split_parts
from .roundrobin_judge import fastest, no_idler_than, objective_judge, with_transfers

AHEADS = (1, 2)
"""Recompute look-ahead tried by default: 1 holds one micro-batch's activations per device, as RoundPipe."""


def dispatched(groups: PoolGroups, layer_costs: Costs, *, num_devices: int, num_microbatches: int, ahead: int,
               weight_transfers: bool = True, split_backward: bool = False,
               next_ahead: int = 0, split_job: tuple | None = None,
               assignment: tuple[int, ...] | None = None) -> tuple[Schedule, Costs, float]:
    """One cut's schedule from the list scheduler, its per-job costs and the scheduler's makespan.
    ``split_job``: (job, how) runs that job's micro-batches on two devices (``roundrobin_dispatch.SPLITS``),
    (job, how, count) on ``count``; job ``"last"`` is the fused last group, whatever its index in this cut;
    ("tail", k, count) the k backward jobs that run last (the model's first layers) interleaved over
    ``count`` devices each; a tuple of such specs applies them all (``split_specs``)."""
    costs = job_costs(layer_costs, groups)
    backward = tuple(i + w for i, w in zip(costs.backward_input, costs.backward_weight, strict=True))
    times = JobTimes(costs.forward, costs.recompute, backward, costs.comm,
                     weight=costs.backward_weight if split_backward else None)
    parts = None if split_job is None else _parts(groups, split_job, num_microbatches)
    rows, makespan = list_dispatch(groups, times, num_devices, num_microbatches, ahead, next_ahead=next_ahead,
                                   parts=parts, assignment=assignment)
    schedule = Schedule(rows, num_stages=groups.num_stages, num_microbatches=num_microbatches, stage_to_rank=None,
                        name="roundrobin", layout="roundrobin", meta=groups.meta())
    return with_transfers(schedule, weight_transfers), costs, makespan


def least_peak(groups: PoolGroups, num_devices: int) -> float:
    """The least activation peak (M_B) any order of the cut can have: one micro-batch of its largest
    gradient group (the fused group's F, or a backward group's R, holds it until the B)."""
    largest = max([groups.last, *groups.backward])
    return largest * num_devices / groups.num_layers


def split_specs(split_job: tuple) -> tuple[tuple, ...]:
    """``split_job`` as a tuple of specs (one spec, or a tuple of them; see ``dispatched``)."""
    if not split_job:
        return ()
    return tuple(split_job) if isinstance(split_job[0], tuple) else (tuple(split_job),)


def _parts(groups: PoolGroups, split_job: tuple, num_microbatches: int) -> dict | None:
    parts = {}
    for spec in split_specs(split_job):
        if spec[0] == "tail":
            _, k, count = spec
            jobs, how = range(max(groups.last_stage + 1, groups.num_stages - k), groups.num_stages), "interleaved"
        elif spec[0] == "fill":
            _, k, count = spec
            jobs, how = range(min(k, len(groups.forward))), "interleaved"
        else:
            job = groups.last_stage if spec[0] == "last" else spec[0]
            jobs, how, count = ([job] if job < groups.num_stages else []), spec[1], spec[2] if len(spec) > 2 else 2
        for job in jobs:
            parts.update(split_parts(job, how, num_microbatches, min(count, num_microbatches)))
    return parts or None


def search(layer_costs: Costs, **options) -> Schedule:
    """The plan ``timed_search`` finds (same options), without its time."""
    return timed_search(layer_costs, **options)[0]


def timed_search(layer_costs: Costs, *, num_devices: int, num_microbatches: int, memory_limit: float | None,
                 pinned: PoolGroups | None = None, ahead: int | None = None, weight_transfers: bool = True,
                 split_backward: bool | None = False, weight_limit: int | None = None,
                 budget: int | None = None, objective: str = "makespan",
                 plans: dict | None = None) -> tuple[Schedule, float]:
    """The fastest (cut, look-ahead) within ``memory_limit`` (see the module docstring): every cut with
    the first look-ahead, the ``FINALISTS`` best cuts also with the others and with the next job's
    recompute filling the current job's waits (``next_ahead``), ranked by the list scheduler's own
    makespan; the best ``FINALISTS`` of all are judged by the simulator, with transfers.
    ``split_backward``: True I/W, False B, None the faster of the two for the winner (module docstring).
    ``budget``: actions the list scheduler may dispatch (default ``SEARCH_BUDGET``).
    ``objective``: what the simulator judges the finalists by (``roundrobin_judge.OBJECTIVES``).
    ``plans``: the list scheduler's plans so far (``build``), shared with the I/W search that follows.
    Returns the plan and its time by that judge (so the I/W search's is not simulated again)."""
    budget = SEARCH_BUDGET if budget is None else budget
    judge = objective_judge(objective)
    cuts = [pinned] if pinned is not None else candidate_cuts(layer_costs)
    aheads = AHEADS if ahead is None else (ahead,)
    ranked, smallest_peak, spent = [], None, 0
    branches = [ranked]  # the split search's, and one per further grown source (``grown_sources``)
    searched = bool(split_backward)  # None: search with B, then try I/W on the winner (at the end)
    weight_cap = weight_limit  # layers of weights a device may hold at once (``held_weights``)
    figures = {}  # id -> [entry, simulated time, steady bubble, lowered] (``_figures_of``)
    plans = {} if plans is None else plans  # (cut, look-ahead, next_ahead, job parts, I/W) -> ``dispatched``

    def build(order: int, look: int, next_ahead: int, split_job: tuple | None, split: bool) -> tuple | None:
        """A ranked entry (makespan, order, variant, schedule, costs), or None outside the limits."""
        nonlocal smallest_peak, spent
        spent += actions(cuts[order])
        if memory_limit is not None:  # one micro-batch of its largest gradient group is held at some point
            least = least_peak(cuts[order], num_devices)
            if least > memory_limit + 1e-9:  # so no order of this cut fits: skip dispatching it
                smallest_peak = least if smallest_peak is None else min(smallest_peak, least)
                return None
        # a plan met again (a grown cut another branch dispatched, a local search's step back, the two
        # winners' I/W plans, a job split written two ways) counts against the budget as before, but is
        # not dispatched again
        parts = _parts(cuts[order], split_job, num_microbatches) if split_job else None
        key = (cuts[order], look, next_ahead, None if parts is None else tuple(sorted(parts.items())), split)
        if key not in plans:
            plans[key] = dispatched(cuts[order], layer_costs, num_devices=num_devices,
                                    num_microbatches=num_microbatches, ahead=look, weight_transfers=False,
                                    split_backward=split, next_ahead=next_ahead, split_job=split_job or None)
        schedule, costs, makespan = plans[key]
        jobs, layers = held_weights(schedule)
        if jobs > 2 or weight_cap is not None and layers > weight_cap:
            return None
        if memory_limit is not None:
            peak = max(peak_memory(schedule))
            smallest_peak = peak if smallest_peak is None else min(smallest_peak, peak)
            if peak > memory_limit + 1e-9:
                return None
        return makespan, order, (look, next_ahead, split_job or ()), schedule, costs

    def consider(order: int, look: int, next_ahead: int = 0, split_job: tuple | None = None) -> float | None:
        entry = build(order, look, next_ahead, split_job, searched)
        if entry is None:
            return None
        ranked.append(entry)
        return entry[0]

    def actions(cut: PoolGroups) -> int:
        return (3 if searched else 2) * cut.num_stages * num_microbatches  # I and W are two actions

    for order in range(len(cuts)):
        if order and spent + actions(cuts[order]) > budget // 2:
            break  # large models: the first tapers' cuts only (they have many small jobs already)
        consider(order, aheads[0])
        wide = fused_devices(cuts[order], layer_costs, num_devices, num_microbatches)
        if wide is not None:  # the fused group paces this cut's jobs: also with it split over devices
            consider(order, aheads[0], 0, ("last", "interleaved", wide))
    ranked.sort(key=_rank)
    for order, split_job in dict.fromkeys((r[1], r[2][2]) for r in ranked[:FINALISTS]):
        for look in aheads[1:]:
            consider(order, look, 0, split_job)
        for look in aheads if ahead is None else ():  # and recompute the next job's micro-batches in the
            consider(order, look, num_microbatches, split_job)  # current job's waits (a pinned look-ahead holds)
    if not ranked:
        if memory_limit is None or smallest_peak is None:  # no cut passed the weight limit to be measured
            raise ValueError(f"no round-robin cut of the {len(layer_costs.forward)} layers keeps a device within "
                             f"weight_limit={weight_limit} layers of weights; raise weight_limit"
                             + ("" if memory_limit is None else f" (every cut failed it before "
                                                                f"memory_limit={memory_limit:g} M_B was checked)"))
        raise ValueError(
            f"no round-robin cut of the {len(layer_costs.forward)} layers fits memory_limit={memory_limit:g} M_B "
            f"(the smallest peak found is {smallest_peak:g} M_B); raise the limit, or pin smaller groups with "
            f"backward_stages= and last_layers="
        )
    ranked.sort(key=_rank)
    if pinned is None:  # the cut chosen with the dispatch: a local search from the best plan and, if that
        starts = [ranked[0], next((r for r in ranked if not r[2][2]), None)]  # is split, from the best unsplit
        for start in dict.fromkeys(id(r) for r in starts if r is not None):
            makespan, order, (look, next_ahead, split_start) = next(r for r in starts if id(r) == start)[:3]

            def evaluate(cut: PoolGroups, look=look, next_ahead=next_ahead, split_start=split_start) -> float | None:
                cuts.append(cut)  # under the start's job split, if any
                return consider(len(cuts) - 1, look, next_ahead, split_start)

            roundrobin_refine.refine(cuts[order], makespan, evaluate, actions_per_evaluation=actions,
                                     budget=min(roundrobin_refine.ACTION_BUDGET, max(0, budget - spent)))
        ranked.sort(key=_rank)
    # the best plan with no job split (the fine cuts' candidates may come with their fused group split)
    unsplit = next((r for r in ranked if not r[2][2]), ranked[0])
    if num_devices >= 2 and num_microbatches >= 2:  # then split jobs over devices, from the best unsplit plan
        _, order, (look, next_ahead, _), schedule, costs = unsplit
        if weight_limit is None:  # within the weights the best unsplit plan holds per device
            weight_cap = held_weights(schedule)[1]
        sources = grown_sources(ranked[0], unsplit) if pinned is None else [unsplit]  # before the pacing splits
        for job in pacing_jobs(cuts[order], costs, num_microbatches):
            for how in SPLITS:
                consider(order, look, next_ahead, (job, how))
        grown = [] if pinned is not None else grown_fused(cuts[order], layer_costs, num_devices, num_microbatches,
                                                          weight_cap=weight_cap)
        pre, before = list(ranked), len(ranked)  # ``pre``: where a further source's branch starts
        for cut, count in grown:  # a larger fused group (less recompute) split wide
            if memory_limit is not None and cut.last * num_devices / cut.num_layers > memory_limit + 1e-9:
                continue  # one micro-batch of it (F held until B) is over the limit already
            cuts.append(cut)
            consider(len(cuts) - 1, look, next_ahead, ("last", "interleaved", count))
        if len(ranked) > before:  # the best of them with every look-ahead
            _, grown_order, (_, _, split_job) = min(ranked[before:], key=_rank)[:3]
            for variant in [(a, n) for a in aheads for n in (0, num_microbatches)]:
                if variant != (look, next_ahead):
                    consider(grown_order, *variant, split_job)
        ranked.sort(key=_rank)
        # then the drain: the last backward jobs run one after another (each waits for the gradient of the
        # one before it), so their ends stagger by a micro-batch each; dealt over more devices, they end sooner
        _, order, (look, next_ahead, split_job) = ranked[0][:3]
        for k, count in TAIL_SPLITS if num_microbatches >= 2 * num_devices >= 2 * TAIL_DEVICES else ():
            if count <= num_devices:
                consider(order, look, next_ahead, (*split_specs(split_job), ("tail", min(k, num_devices), count)))
        ranked.sort(key=_rank)
        # and the fill: the first forward jobs start a micro-batch of the wavefront apart, one per device;
        # dealt over more devices, more devices start at once (``FILL_SPLITS``). Then a second local search
        # under the whole job split (the first ran before the splits); the best plan these find replaces
        # the one they start from only when it is faster and idles no more back to back (``no_idler_than``)
        base, before = ranked[0], len(ranked)
        _, order, (look, next_ahead, split_job) = base[:3]
        for k, count in FILL_SPLITS if num_microbatches >= 2 * num_devices >= 2 * TAIL_DEVICES else ():
            if count <= num_devices:
                consider(order, look, next_ahead, (*split_specs(split_job), ("fill", k, count)))
        if pinned is None:
            makespan, order, (look, next_ahead, split_job) = min(ranked, key=_rank)[:3]

            def evaluate_split(cut: PoolGroups, look=look, next_ahead=next_ahead, split_job=split_job):
                cuts.append(cut)
                return consider(len(cuts) - 1, look, next_ahead, split_job)

            roundrobin_refine.refine(cuts[order], makespan, evaluate_split, actions_per_evaluation=actions,
                                     budget=min(SPLIT_REFINE_BUDGET, budget // 2))
        _keep_first_accepted(ranked, before, no_idler_than(base, weight_transfers, judge, figures), tries=1)
        # last, the drain's very last job over every device (``widest_drain``), on top of the best plan's
        # split, kept on the same terms
        base, before = ranked[0], len(ranked)
        _, order, (look, next_ahead, split_job) = base[:3]
        for spec in widest_drain(split_job, num_devices) if num_microbatches >= 2 * num_devices >= 2 * TAIL_DEVICES \
                else ():
            consider(order, look, next_ahead, spec)
        _keep_first_accepted(ranked, before, no_idler_than(base, weight_transfers, judge, figures), tries=ACCEPT_TRIES)
        first_spent = spent
        for source in sources[1:]:  # the best plan's split fused group one layer larger, then its drain
            ranked = list(pre)
            grown = one_layer_more(cuts[source[1]], weight_cap)
            if grown is not None and (memory_limit is None
                                      or grown.last * num_devices / grown.num_layers <= memory_limit + 1e-9):
                cuts.append(grown)
                _, _, (source_look, source_next, split_job) = source[:3]
                if consider(len(cuts) - 1, source_look, source_next, split_job) is not None:
                    for k, count in TAIL_SPLITS if num_microbatches >= 2 * num_devices >= 2 * TAIL_DEVICES else ():
                        if count <= num_devices:
                            consider(len(cuts) - 1, source_look, source_next,
                                     (*split_specs(split_job), ("tail", min(k, num_devices), count)))
                    # then its forward groups evened into one more, under each fill split and the branch's
                    # best drain, and the best of those under the other drains (``evened_forward``)
                    base, before = min(ranked[len(pre):], key=_rank), len(ranked)
                    recut = evened_forward(grown, len(grown.forward) + 1)
                    if recut is not None and num_microbatches >= 2 * num_devices >= 2 * TAIL_DEVICES:
                        cuts.append(recut)
                        for spec in filled(base[2][2], num_devices):
                            consider(len(cuts) - 1, source_look, source_next, spec)
                        if len(ranked) > before:
                            for spec in other_drains(min(ranked[before:], key=_rank)[2][2], num_devices):
                                consider(len(cuts) - 1, source_look, source_next, spec)
                        _keep_first_accepted(ranked, before, no_idler_than(base, weight_transfers, judge, figures),
                                             tries=1)
            branches.append(sorted(ranked, key=_rank))
        spent = first_spent  # its few dispatches on top of the budget: the I/W search's leftover as without it
        ranked = sorted({id(e): e for branch in branches for e in branch}.values(), key=_rank)
    # the simulator (LOAD/STORE costs included) judges the best FINALISTS and the best unsplit, of the split
    # search's alone and of every branch's; each of the two winners then tries I and W (below)
    first = fastest(finalists(branches[0], unsplit), weight_transfers, judge, figures)
    winner, schedule, makespan = fastest(finalists(ranked, unsplit, *branches), weight_transfers, judge, figures)
    if split_backward is None:  # the winners' cut and job split with I and W under every look-ahead; the
        looks = [(a, n) for a in aheads for n in ((0, num_microbatches) if ahead is None else (0,))]
        first_spent = None
        for tried in dict.fromkeys(id(w) for w in (first[0], winner)):  # simulator judges the list scheduler's
            _, order, (_, _, split_job) = next(w for w in (first[0], winner) if id(w) == tried)[:3]  # best of them
            split = [e for e in (build(order, a, n, split_job, True) for a, n in looks) if e is not None]
            first_spent = spent if first_spent is None else first_spent  # the second winner's on top of the budget
            if split:
                _, split_schedule, split_makespan = fastest([min(split, key=_rank)], weight_transfers, judge,
                                                             figures)
                if split_makespan < makespan - 1e-9:  # B on a tie
                    schedule, makespan = split_schedule, split_makespan
        spent = first_spent
        if budget - spent >= LEFTOVER_SEARCH:  # B finished early: a whole I/W search in what is left
            try:
                split_found = timed_search(layer_costs, num_devices=num_devices, num_microbatches=num_microbatches,
                                           memory_limit=memory_limit, pinned=pinned, ahead=ahead,
                                           weight_transfers=weight_transfers, split_backward=True,
                                           weight_limit=weight_cap, budget=budget - spent, objective=objective,
                                           plans=plans)
            except ValueError:  # no cut within the limits under I/W
                return schedule, makespan
            if split_found[1] < makespan - 1e-9:
                return split_found
    return schedule, makespan


def _keep_first_accepted(ranked: list, before: int, accepts, *, tries: int) -> None:
    """Of the entries from ``before`` on, keep only the fastest (by ``_rank``) that ``accepts``, trying the
    best of each job split in turn (a split's faster cuts idle alike back to back), ``tries`` of them at
    most; ``ranked`` ends sorted."""
    best_per_split = {}
    for entry in sorted(ranked[before:], key=_rank):
        best_per_split.setdefault(_rank(entry)[4], entry)
    found = next((e for e in list(best_per_split.values())[:tries] if accepts(e)), None)
    del ranked[before:]
    ranked.extend([found] if found is not None else [])
    ranked.sort(key=_rank)


ACCEPT_TRIES = 4
"""Job splits whose fastest plan the widest drain's ``_keep_first_accepted`` checks back to back, best
first (each check a simulation and a steady-state run of four iterations)."""


GROWN_LAST = (0.125, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8)
"""Fused-group sizes tried with the group split over devices, as shares of the model's layers."""

GROWN_STEPS = 8
"""At most this many fused-group sizes one layer apart above the unsplit plan's, within the weight limit."""


def grown_fused(groups: PoolGroups, layer_costs: Costs, num_devices: int, num_microbatches: int, *,
                weight_cap: int | None = None) -> list[tuple[PoolGroups, int]]:
    """(cut, devices) pairs: ``groups`` with a fused group of each ``GROWN_LAST`` size above its own (its
    layers recompute nothing, so the step has less work), and of every size up to ``weight_cap`` - 1 (the
    most a device can hold beside a one-layer next job: under a small weight limit the shares skip them),
    split over about as many devices as bring its time per micro-batch down to the slowest other job's
    (and one more; at most every device), so it does not pace the step."""
    found = []
    small = range(groups.last + 1, min(weight_cap or 0, groups.last + 1 + GROWN_STEPS))
    sizes = sorted({*small, *(round(share * groups.num_layers) for share in GROWN_LAST)})
    for last in sizes:
        if last <= groups.last or last >= groups.num_layers or weight_cap is not None and last > weight_cap:
            continue
        cut = with_last(groups, last)
        costs = job_costs(layer_costs, cut)
        per = [costs.forward[j] + costs.backward_input[j] + costs.backward_weight[j]
               + (costs.recompute[j] if cut.role(j) == "backward" else 0.0) for j in range(cut.num_stages)]
        others = max((t for j, t in enumerate(per) if j != cut.last_stage), default=0.0)
        if others <= 0.0:
            continue
        most = min(num_devices, num_microbatches)
        wide = min(max(2, math.ceil(per[cut.last_stage] / others - 1e-9)), most)
        for count in dict.fromkeys((wide, wide + 1 if wide < most else wide - 1)):
            if count >= 2:
                found.append((cut, count))
    return found


def grown_sources(best, unsplit) -> list:
    """The plans whose fused groups grow: the best unsplit plan (``grown_fused``, the whole split search
    follows) and, when another, the best plan when its only job split is its fused group's (a fine cut
    whose fused group paces it unsplit: its unsplit plan may be a coarser cut's, whose grown groups lose
    the fine cut's short jobs; ``one_layer_more`` under the same split, then its drain's splits, a branch
    of its own: a few dispatches, so the budget bound holds, and never a change to the first branch's plan)."""
    specs = split_specs(best[2][2])
    if best is unsplit or not specs or any(spec[0] != "last" for spec in specs):
        return [unsplit]
    return [unsplit, best]


def one_layer_more(groups: PoolGroups, weight_cap: int | None) -> PoolGroups | None:
    """``groups`` with one more layer in its fused group (``with_last``), or None when the body would be
    empty or the group would be over ``weight_cap`` layers."""
    last = groups.last + 1
    if last >= groups.num_layers or weight_cap is not None and last > weight_cap:
        return None
    return with_last(groups, last)


def evened_forward(groups: PoolGroups, count: int) -> PoolGroups | None:
    """``groups`` with its forward layers in ``count`` groups as even as can be, the smaller first (they
    run first: the wavefront waits on them), or None when the body has fewer layers. A fill split
    (``FILL_SPLITS``) starts several devices on each first job, which a tapered cut's short first groups
    did one by one; under it an even cut's jobs are shorter. Tried in the grown branch (``grown_sources``):
    a move of every forward boundary at once, which no single move of ``roundrobin_refine`` makes
    (llama-3.1-8b-like, 8 devices, 32 micro-batches: (2, 5, 5, 5, 5, 5, 4) to (3, 4, 4, 4, 4, 4, 4, 4),
    with the fill and drain split, 609.0 to 597.3)."""
    body = sum(groups.forward)
    if not 1 <= count <= body:
        return None
    small, extra = divmod(body, count)
    return PoolGroups((small,) * (count - extra) + (small + 1,) * extra, groups.last, groups.backward)


def filled(split_job: tuple, num_devices: int) -> list[tuple[tuple, ...]]:
    """``split_job`` (``split_specs``) with each ``FILL_SPLITS`` entry (that fits ``num_devices``) added."""
    return [(*split_specs(split_job), ("fill", k, count)) for k, count in FILL_SPLITS if count <= num_devices]


def other_drains(split_job: tuple, num_devices: int) -> list[tuple[tuple, ...]]:
    """``split_job`` with its drain split (``TAIL_SPLITS``, none or one) replaced by each other entry."""
    own = split_specs(split_job)
    kept = tuple(spec for spec in own if spec[0] != "tail")
    drains = [("tail", min(k, num_devices), count) for k, count in TAIL_SPLITS if count <= num_devices]
    return [(*kept, drain) for drain in drains if drain not in own]


def finalists(ranked: list, unsplit, *branches: list) -> list:
    """The entries the simulator judges: the ``FINALISTS`` best of ``ranked``, then ``unsplit`` and each
    branch's ``FINALISTS`` best where not among them (in that order: the first wins a tie)."""
    chosen = list(ranked[:FINALISTS])
    for extra in [unsplit, *(e for branch in branches for e in branch[:FINALISTS])]:
        if all(r is not extra for r in chosen):
            chosen.append(extra)
    return chosen


def fused_devices(groups: PoolGroups, layer_costs: Costs, num_devices: int, num_microbatches: int) -> int | None:
    """Devices to split the fused last group over when its F + B per micro-batch is slower than every other
    job's (F, or R + B): about as many as bring it down to the slowest other job's; None when it does not
    pace (or nothing else is there to pace against)."""
    costs = job_costs(layer_costs, groups)
    per = [costs.forward[j] if groups.role(j) == "forward" else
           costs.backward_input[j] + costs.backward_weight[j]
           + (costs.forward[j] if groups.role(j) == "last" else costs.recompute[j]) for j in range(groups.num_stages)]
    others = max((t for j, t in enumerate(per) if j != groups.last_stage), default=0.0)
    most = min(num_devices, num_microbatches)
    if others <= 0.0 or per[groups.last_stage] <= others + 1e-9 or most < 2:
        return None
    return min(most, max(2, math.ceil(per[groups.last_stage] / others - 1e-9)))


def pacing_jobs(groups: PoolGroups, costs: Costs, num_microbatches: int) -> list:
    """Jobs worth splitting over two devices: the fused last group (``"last"``) and, when another, the job
    with the most work over all micro-batches (it paces the step when no other device can hide it)."""
    work = [num_microbatches * (costs.forward[j] + costs.recompute[j] + costs.backward_input[j]
                                + costs.backward_weight[j]) if groups.role(j) != "forward"
            else num_microbatches * costs.forward[j] for j in range(groups.num_stages)]
    heaviest = max(range(groups.num_stages), key=work.__getitem__)
    return ["last"] + ([heaviest] if heaviest != groups.last_stage else [])


TAIL_SPLITS = ((1, 2), (8, 4))
"""(k, devices): the last k backward jobs (at most one per device) split over that many devices each.
Tried only on ``TAIL_DEVICES`` or more devices and at least twice as many micro-batches: the drain is
then a long wavefront (its last N jobs end a micro-batch apart, one per device, N - 1 micro-batches'
time from first to last); on fewer devices, or with a handful of micro-batches per part, it is a
micro-batch or two and the split buys little beside its uploads."""

TAIL_DEVICES = 4
"""The fewest devices on which the drain's split is tried (``TAIL_SPLITS``), and the fill's (``FILL_SPLITS``)."""

FILL_SPLITS = ((2, 4), (4, 2), (8, 2))
"""(k, devices): the first k forward jobs split over that many devices each (the fill's mirror of
``TAIL_SPLITS``): device d's first job waits for micro-batch 0 to pass the d jobs before it, so N devices
idle about N (N - 1) / 2 forward jobs' micro-batch times in all; with the first jobs dealt over c
devices each, c devices start at every step of the wavefront and its idle falls to about N (N / c - 1) / 2."""


def widest_drain(split_job: tuple, num_devices: int) -> list[tuple[tuple, ...]]:
    """Job splits (``split_specs``) with the drain's very last job dealt over every device, on top of
    ``split_job``, and also with ``TAIL_SPLITS``' widest entry when ``split_job`` deals no drain. The last
    job waits for the gradient of the one before it, micro-batch by micro-batch, so as the drain narrows,
    the devices that ran the jobs before it idle while its parts finish (with 8 jobs over 4 devices each,
    half the devices end a part of a job early); dealt over every device, each ends with a share of it
    (one upload of its weights each). The devices then free at once, which may idle the next iteration's
    fill back to back, so these plans pass ``no_idler_than`` as the fill's do. None when ``TAIL_SPLITS``
    is empty (no drain split) or ``split_job`` deals its drain over every device already (on 4 devices,
    ``TAIL_SPLITS``' (8, 4) does: the widest drain on top of it would dispatch the same plan again)."""
    own = split_specs(split_job)
    widest = ("tail", 1, num_devices)
    if not TAIL_SPLITS or any(spec[0] == "tail" and spec[2] >= num_devices for spec in own):
        return []  # no drain split at all, or its last job already over every device (the same plan again)
    found = [(*own, widest)]
    if not any(spec[0] == "tail" for spec in own):
        k, count = max(TAIL_SPLITS, key=lambda entry: entry[0])
        if count < num_devices:
            found.append((*own, ("tail", min(k, num_devices), count), widest))
    return found


SPLIT_REFINE_BUDGET = 100_000
"""Actions the second local search (under the whole job split: fused group, drain and fill) may dispatch,
at most half the search's budget, on top of it (the first search spends all of it on large models)."""

LEFTOVER_SEARCH = 20_000
"""Actions left by the B search (``split_backward=None``) below which no whole I/W search follows it."""

FINALISTS = 3
"""Cuts tried with every look-ahead, and candidates the simulator re-judges, after the ranking."""

SEARCH_BUDGET = 200_000
"""Actions the list scheduler may dispatch in one search (about 0.7 s): candidate cuts take at most half
(in ``candidate_cuts``' order), the finalists' look-aheads what they need, the local search the rest
(at most ``roundrobin_refine.ACTION_BUDGET``)."""


def _rank(entry) -> tuple:
    """Makespan first, then the candidate's order and variant (a split's job may be "last" or an index)."""
    makespan, order, (look, next_ahead, split_job) = entry[:3]
    return makespan, order, look, next_ahead, tuple(str(x) for x in split_job)
