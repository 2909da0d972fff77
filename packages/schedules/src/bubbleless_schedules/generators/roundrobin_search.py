"""``roundrobin`` with per-layer costs: the cut and the dispatch chosen together by the simulator.

Every candidate cut (``roundrobin_cut.candidate_cuts``, or the one cut the options pin) is dispatched by
the list scheduler (``roundrobin_dispatch``) with recompute running at most 1 micro-batch ahead; the
``FINALISTS`` best cuts also with 2 ahead and with the device's next job recomputing in the current
job's waits (``next_ahead``; not when the options pin ``recompute_ahead``, which bounds what a device
recomputes before its backward), and, with its best look-ahead, with the job that paces the step split
over two devices (``pacing_jobs``: the fused last group, and the job with the most work; halves or
interleaved micro-batches, ``roundrobin_dispatch.SPLITS``; each of the two devices LOADs the job's
weights and STOREs its partial gradients). The list scheduler's own makespans rank them; unless the options pin
the cut, the best one's cut is then refined by a local search under the same look-ahead
(``roundrobin_refine``: single-layer moves between groups, merges and splits). The best
``FINALISTS``, weight transfers inserted, are simulated under the per-job costs the layer costs sum
to, and the fastest within ``memory_limit`` wins (the first on a tie, so the result is deterministic);
when all of them split a job, the best unsplit candidate is judged with them, so the extra upload a split
costs (``layer_costs.load``/``store``) is weighed by the simulator.
"""

from __future__ import annotations

from ..costs import Costs
from ..lowering import add_weight_transfers
from ..roundrobin_layout import PoolGroups
from ..schedule import Schedule
from ..simulate import peak_memory, simulate
from . import roundrobin_refine
from .roundrobin_cut import candidate_cuts, job_costs
from .roundrobin_dispatch import SPLITS, JobTimes, list_dispatch, split_parts

AHEADS = (1, 2)
"""Recompute look-ahead tried by default: 1 holds one micro-batch's activations per device, as RoundPipe."""


def dispatched(groups: PoolGroups, layer_costs: Costs, *, num_devices: int, num_microbatches: int, ahead: int,
               weight_transfers: bool = True, split_backward: bool = False,
               next_ahead: int = 0, split_job: tuple | None = None) -> tuple[Schedule, Costs, float]:
    """One cut's schedule from the list scheduler, its per-job costs and the scheduler's makespan.
    ``split_job``: (job, how) runs that job's micro-batches on two devices (``roundrobin_dispatch.SPLITS``);
    job ``"last"`` is the fused last group, whatever its index in this cut."""
    costs = job_costs(layer_costs, groups)
    backward = tuple(i + w for i, w in zip(costs.backward_input, costs.backward_weight, strict=True))
    times = JobTimes(costs.forward, costs.recompute, backward, costs.comm,
                     weight=costs.backward_weight if split_backward else None)
    parts = None
    if split_job is not None:
        job = groups.last_stage if split_job[0] == "last" else split_job[0]
        parts = split_parts(job, split_job[1], num_microbatches) if job < groups.num_stages else None
    rows, makespan = list_dispatch(groups, times, num_devices, num_microbatches, ahead, next_ahead=next_ahead,
                                   parts=parts)
    schedule = Schedule(rows, num_stages=groups.num_stages, num_microbatches=num_microbatches, stage_to_rank=None,
                        name="roundrobin", layout="roundrobin", meta=groups.meta())
    return (add_weight_transfers(schedule) if weight_transfers else schedule), costs, makespan


def search(layer_costs: Costs, *, num_devices: int, num_microbatches: int, memory_limit: float | None,
           pinned: PoolGroups | None = None, ahead: int | None = None, weight_transfers: bool = True,
           split_backward: bool = False) -> Schedule:
    """The fastest (cut, look-ahead) within ``memory_limit`` (see the module docstring): every cut with
    the first look-ahead, the ``FINALISTS`` best cuts also with the others and with the next job's
recompute filling the current job's waits (``next_ahead``), ranked by the list
    scheduler's own makespan; the best ``FINALISTS`` of all are judged by the simulator, with transfers."""
    cuts = [pinned] if pinned is not None else candidate_cuts(layer_costs)
    aheads = AHEADS if ahead is None else (ahead,)
    ranked, smallest_peak, spent = [], None, 0

    def consider(order: int, look: int, next_ahead: int = 0, split_job: tuple | None = None) -> float | None:
        nonlocal smallest_peak, spent
        spent += actions(cuts[order])
        schedule, costs, makespan = dispatched(cuts[order], layer_costs, num_devices=num_devices,
                                               num_microbatches=num_microbatches, ahead=look,
                                               weight_transfers=False, split_backward=split_backward,
                                               next_ahead=next_ahead, split_job=split_job)
        if memory_limit is not None:
            peak = max(peak_memory(schedule))
            smallest_peak = peak if smallest_peak is None else min(smallest_peak, peak)
            if peak > memory_limit + 1e-9:
                return None
        ranked.append((makespan, order, (look, next_ahead, split_job or ()), schedule, costs))
        return makespan

    def actions(cut: PoolGroups) -> int:
        return 2 * cut.num_stages * num_microbatches

    for order in range(len(cuts)):
        if order and spent + actions(cuts[order]) > SEARCH_BUDGET // 2:
            break  # large models: the first tapers' cuts only (they have many small jobs already)
        consider(order, aheads[0])
    ranked.sort(key=_rank)
    for order in dict.fromkeys(r[1] for r in ranked[:FINALISTS]):
        for look in aheads[1:]:
            consider(order, look)
        for look in aheads if ahead is None else ():  # and recompute the next job's micro-batches in the
            consider(order, look, num_microbatches)      # current job's waits (a pinned look-ahead holds to it)
    ranked.sort(key=_rank)
    best_of_cut = {}
    for r in ranked:
        best_of_cut.setdefault(r[1], r)
    if num_microbatches >= 2 and num_devices >= 2:  # the job that paces the step on two devices
        for _, order, (look, next_ahead, _), _, costs in list(best_of_cut.values())[:FINALISTS]:
            for job in pacing_jobs(cuts[order], costs, num_microbatches):
                for how in SPLITS:
                    consider(order, look, next_ahead, (job, how))
    if not ranked:
        raise ValueError(
            f"no round-robin cut of the {len(layer_costs.forward)} layers fits memory_limit={memory_limit:g} M_B "
            f"(the smallest peak found is {smallest_peak:g} M_B); raise the limit, or pin smaller groups with "
            f"backward_stages= and last_layers="
        )
    ranked.sort(key=_rank)
    if pinned is None:  # the cut chosen with the dispatch: a local search from the best one
        makespan, order, (look, next_ahead, split_job) = ranked[0][:3]

        def evaluate(cut: PoolGroups) -> float | None:
            cuts.append(cut)
            return consider(len(cuts) - 1, look, next_ahead, split_job or None)

        roundrobin_refine.refine(cuts[order], makespan, evaluate, actions_per_evaluation=actions,
                                 budget=min(roundrobin_refine.ACTION_BUDGET, max(0, SEARCH_BUDGET - spent)))
        ranked.sort(key=_rank)
    chosen = ranked[:FINALISTS]
    unsplit = next((r for r in ranked if not r[2][2]), None)  # the simulator (LOAD/STORE costs included)
    if unsplit is not None and all(r[2][2] for r in chosen):  # judges a split against the best unsplit one
        chosen.append(unsplit)
    finalists = [add_weight_transfers(r[3]) if weight_transfers else r[3] for r in chosen]
    judged = [(simulate(s, r[4]).makespan, i) for i, (s, r) in enumerate(zip(finalists, chosen, strict=True))]
    return finalists[min(judged)[1]]


def pacing_jobs(groups: PoolGroups, costs: Costs, num_microbatches: int) -> list:
    """Jobs worth splitting over two devices: the fused last group (``"last"``) and, when another, the job
    with the most work over all micro-batches (it paces the step when no other device can hide it)."""
    work = [num_microbatches * (costs.forward[j] + costs.recompute[j] + costs.backward_input[j]
                                + costs.backward_weight[j]) if groups.role(j) != "forward"
            else num_microbatches * costs.forward[j] for j in range(groups.num_stages)]
    heaviest = max(range(groups.num_stages), key=work.__getitem__)
    return ["last"] + ([heaviest] if heaviest != groups.last_stage else [])


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
