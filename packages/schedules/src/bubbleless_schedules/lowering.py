"""Lowering passes: pure functions from schedule to schedule that make implicit work explicit.

``add_communication(schedule)``
    Inserts ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B`` for every edge between two ranks of a
    stage-bound schedule and marks it ``meta.comm=1`` (the layout then makes each consumer wait for its
    local RECV). Every action names the stage of the rank that performs it: ``2SEND_F0`` (stage 2 sends
    its output for micro-batch 0), ``3RECV_F0`` (stage 3 receives it), ``3SEND_B0`` (stage 3 sends the
    gradient of its input), ``2RECV_B0`` (stage 2 receives it).

    **The posting rule, which cannot deadlock:**

    1. A SEND is posted right after the compute that produces its tensor, and it never blocks the
       worker (``isend``; its buffer is kept until the send completes).
    2. A RECV is posted right before the compute that consumes its tensor, and that compute waits for it.
    3. Between one ordered pair of ranks, receives are posted in the order the sends were posted (both
       sides agree on the order, as NCCL-style matching by posting order needs): when a receiver
       consumes in another order than its peer sent, the receive of an earlier-sent tensor moves up to
       just before the receive of the later-sent one that is consumed first.

    Why it cannot deadlock (nor slow anything down): a SEND depends only on the compute right before
    it on its own worker, so the lowered schedule's waits are the unlowered schedule's waits with each
    cross-rank edge routed through a RECV. A RECV moved up by rule 3 waits for a tensor sent *before*
    the tensor the worker needs at that point anyway, and a worker sends in its own order, so the
    moved receive is never the later of the two. The unlowered schedule runs to the end (``validate``
    checks it), hence so does the lowered one, with every compute at the same time under every cost.
    Blocking sends would break rule 1 and deadlock 1F1B (each rank's second send waits for a receive
    its peer posts only after its own send), which is why sends must not block.

``fuse_backward(schedule, costs=None)``
    Fuses an ``I`` and the ``W`` of the same (stage, micro-batch) into one ``B`` where nothing would
    fill the gap between them. Without costs: where W directly follows its I on the same worker (only
    sends and receives between them). With costs: every I/W pair, each kept fused only if the simulated
    makespan does not grow (fusing delays the input gradient by W's cost, which matters when a peer
    waits for it; it never raises memory, since W's activations are freed earlier). O(pairs) simulations.

``add_weight_transfers(schedule)``
    For a round-robin pool schedule: ``LOAD`` before each job's first action, ``STORE`` after the last
    action of each job that computes gradients. The ``roundrobin`` generator calls it (unless asked for
    ``weight_transfers=False``), so this is the one place that decides where transfers go.
"""

from __future__ import annotations

from collections import defaultdict

from .action import COMM_KINDS, STAGE_KINDS, Action, Kind
from .costs import Costs
from .layouts import is_lowered
from .schedule import Schedule
from .simulate import simulate

# (producing compute kinds, send kind, recv kind, consumer stage offset, consuming compute kinds)
_EDGES = (
    ((Kind.F,), Kind.SEND_F, Kind.RECV_F, +1, (Kind.F,)),
    ((Kind.I, Kind.B), Kind.SEND_B, Kind.RECV_B, -1, (Kind.I, Kind.B)),
)


def _stage_bound(schedule: Schedule, pass_name: str) -> tuple[int, ...]:
    if schedule.stage_to_rank is None or schedule.layout != "pipeline":
        raise ValueError(
            f"{pass_name} lowers stage-bound pipeline schedules; {schedule.name or 'this schedule'!r} has layout "
            f"{schedule.layout!r} without a stage placement (round-robin workers exchange tensors through "
            f"host memory, use add_weight_transfers for them)"
        )
    return schedule.stage_to_rank


def add_communication(schedule: Schedule) -> Schedule:
    """Insert sends and receives for every cross-rank edge, posted by the rule in the module docstring."""
    placement = _stage_bound(schedule, "add_communication")
    if is_lowered(schedule) or any(a.kind in COMM_KINDS for _, _, a in schedule.all_actions()):
        raise ValueError("schedule already has sends and receives (meta.comm=1); lower it only once")
    last = schedule.num_stages - 1

    sends_after: dict[tuple[int, int], Action] = {}  # (worker, position) -> the send posted after it
    sent_order: dict[tuple[int, int], list[tuple[int, Action]]] = defaultdict(list)  # (src, dst) -> [(pos, recv)]
    consumer_at: dict[Action, int] = {}  # recv -> position of the compute that needs it, on the receiver
    for worker, position, action in schedule.all_actions():
        for producers, send, recv, step, _ in _EDGES:
            peer_stage = action.stage + step
            if not 0 <= peer_stage <= last or placement[peer_stage] == worker:
                continue
            if action.kind in producers:
                sends_after[(worker, position)] = Action(action.stage, send, action.microbatch)
                message = Action(peer_stage, recv, action.microbatch)
                sent_order[(worker, placement[peer_stage])].append((position, message))
        for _, _, recv, step, consumers in _EDGES:
            source = action.stage - step
            if action.kind in consumers and 0 <= source <= last and placement[source] != worker:
                consumer_at[Action(action.stage, recv, action.microbatch)] = position

    recvs_before: dict[tuple[int, int], list[Action]] = defaultdict(list)  # (worker, position) -> recvs
    for (_, dst), messages in sorted(sent_order.items()):
        earliest = None  # rule 3: no receive after the receive of any tensor sent later on this channel
        placed = []
        for _, recv in reversed(sorted(messages)):
            at = consumer_at[recv]
            earliest = at if earliest is None else min(earliest, at)
            placed.append((earliest, recv))
        for at, recv in reversed(placed):  # back in send order, so ties keep the send order
            recvs_before[(dst, at)].append(recv)

    rows = []
    for worker, actions in enumerate(schedule.actions):
        row: list[Action] = []
        for position, action in enumerate(actions):
            row += recvs_before.get((worker, position), [])
            row.append(action)
            if (worker, position) in sends_after:
                row.append(sends_after[(worker, position)])
        rows.append(row)
    return schedule.replace(actions=rows, meta={**schedule.meta, "comm": 1})


def fuse_backward(schedule: Schedule, costs: Costs | None = None) -> Schedule:
    """Fuse I and W of one (stage, micro-batch) into B where nothing would fill the gap (module docstring)."""
    if costs is None:
        return _fuse(schedule, _adjacent_pairs(schedule))
    best = schedule
    best_makespan = simulate(schedule, costs).makespan
    for pair in _all_pairs(schedule):
        trial = _fuse(best, [pair])
        makespan = simulate(trial, costs).makespan
        if makespan <= best_makespan + 1e-9:
            best, best_makespan = trial, makespan
    return best


def _all_pairs(schedule: Schedule) -> list[tuple[int, Action]]:
    """(worker, I) for every I whose W runs on the same worker, in worker then position order."""
    pairs = []
    for worker, actions in enumerate(schedule.actions):
        present = set(actions)
        pairs += [(worker, a) for a in actions if a.kind is Kind.I and Action(a.stage, Kind.W, a.microbatch) in present]
    return pairs


def _adjacent_pairs(schedule: Schedule) -> list[tuple[int, Action]]:
    """I actions whose W follows with only sends and receives between them."""
    pairs = []
    for worker, actions in enumerate(schedule.actions):
        compute = [a for a in actions if a.kind not in COMM_KINDS]
        for first, second in zip(compute, compute[1:], strict=False):
            if first.kind is Kind.I and second == Action(first.stage, Kind.W, first.microbatch):
                pairs.append((worker, first))
    return pairs


def _fuse(schedule: Schedule, pairs: list[tuple[int, Action]]) -> Schedule:
    by_worker = defaultdict(set)
    for worker, i in pairs:
        by_worker[worker].add(i)
    rows = []
    for worker, actions in enumerate(schedule.actions):
        fused = by_worker.get(worker, set())
        drop = {Action(i.stage, Kind.W, i.microbatch) for i in fused}
        rows.append([Action(a.stage, Kind.B, a.microbatch) if a in fused else a for a in actions if a not in drop])
    return schedule.replace(actions=rows)


def add_weight_transfers(schedule: Schedule) -> Schedule:
    """LOAD before each job's first action and STORE after the last action of each gradient job."""
    if schedule.stage_to_rank is not None:
        raise ValueError(
            "add_weight_transfers is for round-robin pool schedules (stage_to_rank None); stage-bound ranks "
            "keep their stages' weights resident"
        )
    if any(a.kind in STAGE_KINDS for _, _, a in schedule.all_actions()):
        raise ValueError("schedule already has LOAD/STORE actions; add weight transfers only once")
    rows = []
    for actions in schedule.actions:
        first, last, grads = {}, {}, set()
        for position, action in enumerate(actions):
            first.setdefault(action.stage, position)
            last[action.stage] = position
            if action.kind in (Kind.B, Kind.W):
                grads.add(action.stage)
        row = []
        for position, action in enumerate(actions):
            if first[action.stage] == position:
                row.append(Action(action.stage, Kind.LOAD))
            row.append(action)
            if last[action.stage] == position and action.stage in grads:
                row.append(Action(action.stage, Kind.STORE))
        rows.append(row)
    return schedule.replace(actions=rows)
