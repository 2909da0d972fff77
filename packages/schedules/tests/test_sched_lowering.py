"""Lowering passes, each with literal before/after text, and the no-deadlock proof for sends and
receives: every registered stage-bound generator's lowered schedule, over several shapes and costs,
validates, keeps every compute at the time the unlowered schedule ran it, and posts the receives of
each pair of ranks in the order the sends were posted."""

from __future__ import annotations

from collections import defaultdict

import pytest

from bubbleless_schedules import Costs, Kind, Schedule, available, generate, simulate, validate
from bubbleless_schedules.action import COMM_KINDS
from bubbleless_schedules.lowering import add_communication, add_weight_transfers, fuse_backward


def _text(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# -- add_communication -------------------------------------------------------------------------------
def test_add_communication_on_1f1b_literal():
    before = generate("1f1b", num_ranks=2, num_microbatches=2)
    assert before.to_text() == _text(
        "# bubbleless-schedule name=1f1b stages=2 microbatches=2 placement=0,1 layout=pipeline",
        "0F0 0F1 0B0 0B1",
        "1F0 1B0 1F1 1B1",
    )
    assert add_communication(before).to_text() == _text(
        "# bubbleless-schedule name=1f1b stages=2 microbatches=2 placement=0,1 layout=pipeline meta.comm=1",
        "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
        "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1",
    )


V_SHAPED = _text(  # two ranks, stages in a V (0,1,1,0); rank 1 runs micro-batch 1 before micro-batch 0
    "# bubbleless-schedule name=v stages=4 microbatches=2 placement=0,1,1,0 layout=pipeline",
    "0F0 0F1 3F1 3B1 3F0 3B0 0B1 0B0",
    "1F1 2F1 1F0 2F0 2B1 1B1 2B0 1B0",
)


def test_receives_follow_the_send_order_of_their_channel():
    """Rank 1 consumes micro-batch 1 first but rank 0 sent micro-batch 0 first: the receive of 0 moves
    up to just before the receive of 1 (rule 3). Stages 1 and 2 share rank 1, so they exchange nothing."""
    lowered = add_communication(Schedule.from_text(V_SHAPED))
    assert lowered.to_text() == _text(
        "# bubbleless-schedule name=v stages=4 microbatches=2 placement=0,1,1,0 layout=pipeline meta.comm=1",
        "0F0 0SEND_F0 0F1 0SEND_F1 3RECV_F1 3F1 3B1 3SEND_B1 3RECV_F0 3F0 3B0 3SEND_B0 0RECV_B1 0B1 0RECV_B0 0B0",
        "1RECV_F0 1RECV_F1 1F1 2F1 2SEND_F1 1F0 2F0 2SEND_F0 2RECV_B1 2B1 1B1 1SEND_B1 2RECV_B0 2B0 1B0 1SEND_B0",
    )


def _stage_bound_schedules():
    shapes = [(1, 3), (2, 4), (3, 5), (4, 8), (5, 7)]
    for name in available():
        for p, m in shapes:
            try:
                schedule = generate(name, num_ranks=p, num_microbatches=m)
            except ValueError:
                continue  # a shape the generator refuses, with its own message (test_sched_grid checks that)
            if schedule.stage_to_rank is not None:
                yield pytest.param(schedule, id=f"{name}-p{p}-m{m}")


COSTS = [Costs.unit(), Costs(18.5, 18.1, 9.3, comm=0.6), Costs(1.0, 1.0, 0.5, comm=0.5), Costs(1, 2, 1, comm=3.0)]


@pytest.mark.parametrize("schedule", list(_stage_bound_schedules()))
def test_lowered_schedules_of_every_generator_run_as_fast_as_unlowered(schedule):
    lowered = add_communication(schedule)
    validate(lowered)  # complete, and no deadlock
    for costs in COSTS:
        plain = {(s.worker, s.action, edge): t for s in simulate(schedule, costs).spans
                 for edge, t in (("start", s.start), ("end", s.end))}
        computed = {(s.worker, s.action, edge): t for s in simulate(lowered, costs).spans
                    if s.action.kind not in COMM_KINDS for edge, t in (("start", s.start), ("end", s.end))}
        assert computed == pytest.approx(plain)
    _assert_channels_agree(lowered)
    without_comm = [[a for a in row if a.kind not in COMM_KINDS] for row in lowered.actions]
    assert without_comm == [list(row) for row in schedule.actions]


def _assert_channels_agree(lowered: Schedule) -> None:
    """Between each ordered pair of ranks, the i-th send and the i-th receive carry the same tensor."""
    placement = lowered.stage_to_rank
    sends, recvs = defaultdict(list), defaultdict(list)
    for worker, _, action in lowered.all_actions():
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            to = action.stage + (1 if action.kind is Kind.SEND_F else -1)
            sends[(worker, placement[to])].append((to, action.kind, action.microbatch))
        elif action.kind in (Kind.RECV_F, Kind.RECV_B):
            source = action.stage + (-1 if action.kind is Kind.RECV_F else 1)
            kind = Kind.SEND_F if action.kind is Kind.RECV_F else Kind.SEND_B
            recvs[(placement[source], worker)].append((action.stage, kind, action.microbatch))
    assert sends == recvs


def test_receive_order_matters_for_the_checks():
    """The V-shaped example really exercises rule 3: posting its receives just before their consumers
    would break the channel order check."""
    schedule = Schedule.from_text(V_SHAPED)
    naive = add_communication(schedule).actions[1]
    swapped = (naive[1], naive[0]) + naive[2:]
    broken = add_communication(schedule).replace(actions=(add_communication(schedule).actions[0], swapped))
    validate(broken)  # still runs in the simulator, where receives match by name
    with pytest.raises(AssertionError):
        _assert_channels_agree(broken)
    _assert_channels_agree(add_communication(schedule))


def test_a_consumer_waits_for_its_local_receive_in_a_lowered_schedule():
    """1F0 needs the event of 1RECV_F0, not 0F0's, so a receive posted after its consumer deadlocks."""
    lowered = add_communication(generate("1f1b", num_ranks=2, num_microbatches=2))
    rows = [list(r) for r in lowered.actions]
    recv = rows[1].pop(0)
    assert str(recv) == "1RECV_F0" and str(rows[1][0]) == "1F0"
    rows[1].insert(1, recv)
    with pytest.raises(ValueError, match=r"worker 1 waits at 1F0 for \(RECEIVED, RECV_F, 1, 0\)"):
        simulate(lowered.replace(actions=rows))


def test_a_lowered_schedule_missing_a_receive_is_incomplete():
    lowered = add_communication(generate("1f1b", num_ranks=2, num_microbatches=2))
    rows = [list(r) for r in lowered.actions]
    rows[0] = [a for a in rows[0] if str(a) != "0RECV_B1"]
    with pytest.raises(ValueError, match="0RECV_B1, needs 1"):
        validate(lowered.replace(actions=rows))


def test_unlowered_rules_unchanged_comm_costs_still_apply():
    schedule = generate("1f1b", num_ranks=2, num_microbatches=1)
    costs = Costs(1, 1, 1, comm=0.5)
    # 0F0 [0, 1], hop, 1F0 [1.5, 2.5], 1B0 [2.5, 4.5], hop, 0B0 [5, 7]: either way, the hop costs comm
    assert simulate(schedule, costs).makespan == 7.0
    lowered = add_communication(schedule)
    assert lowered.to_text().splitlines()[1:] == ["0F0 0SEND_F0 0RECV_B0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"]
    spans = {str(s.action): (s.start, s.end) for s in simulate(lowered, costs).spans}
    assert spans["1RECV_F0"] == (1.5, 1.5) and spans["0RECV_B0"] == (5.0, 5.0) and spans["0B0"] == (5.0, 7.0)


def test_add_communication_refuses_what_it_cannot_lower():
    lowered = add_communication(generate("1f1b", num_ranks=2, num_microbatches=2))
    with pytest.raises(ValueError, match="lower it only once"):
        add_communication(lowered)
    with pytest.raises(ValueError, match="stage-bound"):
        add_communication(generate("roundrobin", num_ranks=2, num_microbatches=2))


def test_single_rank_needs_no_communication():
    schedule = generate("1f1b", num_ranks=1, num_microbatches=2)
    assert add_communication(schedule).actions == schedule.actions


# -- fuse_backward ---------------------------------------------------------------------------------
SPLIT = _text(
    "# bubbleless-schedule stages=2 microbatches=2 placement=0,1 layout=pipeline",
    "0F0 0F1 0I0 0I1 0W0 0W1",
    "1F0 1I0 1W0 1F1 1I1 1W1",
)


def test_fuse_backward_without_costs_fuses_back_to_back_pairs():
    fused = fuse_backward(Schedule.from_text(SPLIT))
    assert fused.to_text() == _text(
        "# bubbleless-schedule stages=2 microbatches=2 placement=0,1 layout=pipeline",
        "0F0 0F1 0I0 0I1 0W0 0W1",
        "1F0 1B0 1F1 1B1",
    )


def test_fuse_backward_with_costs_fuses_where_the_simulation_loses_nothing():
    """Unit costs: rank 0's W fill a gap its own I would leave, so fusing them is free (and shortens
    the step from 9 to 8); fusing rank 1's last pair would delay the gradient rank 0 waits for."""
    schedule = Schedule.from_text(SPLIT)
    fused = fuse_backward(schedule, Costs.unit())
    assert fused.to_text() == _text(
        "# bubbleless-schedule stages=2 microbatches=2 placement=0,1 layout=pipeline",
        "0F0 0F1 0B0 0B1",
        "1F0 1B0 1F1 1I1 1W1",
    )
    assert simulate(schedule).makespan == 9.0
    assert simulate(fused).makespan == 8.0
    # the structural rule alone fuses 1I1 1W1 and delays the gradient rank 0 waits for: why costs help
    assert simulate(fuse_backward(schedule)).makespan == 10.0


def test_fuse_backward_keeps_sends_after_the_fused_backward():
    lowered = add_communication(Schedule.from_text(SPLIT))
    assert [str(a) for a in lowered.actions[1][-3:]] == ["1I1", "1SEND_B1", "1W1"]
    fused = fuse_backward(lowered)
    assert [str(a) for a in fused.actions[1]] == [
        "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1",
    ]
    validate(fused)


@pytest.mark.parametrize("schedule", [s for s in _stage_bound_schedules() if "-p1-" not in s.id])
def test_fuse_backward_never_slows_or_grows_any_generator(schedule):
    costs = Costs(18.5, 18.1, 9.3, comm=0.6)
    fused = fuse_backward(schedule, costs)
    validate(fused)
    assert simulate(fused, costs).makespan <= simulate(schedule, costs).makespan + 1e-9
    assert max(simulate(fused).peak_memory) <= max(simulate(schedule).peak_memory) + 1e-9


# -- add_weight_transfers --------------------------------------------------------------------------
def test_add_weight_transfers_literal():
    bare = generate("roundrobin", num_ranks=2, num_microbatches=2, num_layers=4, weight_transfers=False)
    header = (
        "# bubbleless-schedule name=roundrobin stages=5 microbatches=2 layout=roundrobin "
        "meta.forward_layers=3 meta.last_layers=1 meta.backward_layers=1,1,1"
    )
    assert bare.to_text() == _text(
        header,
        "0F0 0F1 2R0 2B0 2R1 2B1 4R0 4B0 4R1 4B1",
        "1F0 1B0 1F1 1B1 3R0 3B0 3R1 3B1",
    )
    lowered = add_weight_transfers(bare)
    assert lowered.to_text() == _text(
        header,
        "0LOAD 0F0 0F1 2LOAD 2R0 2B0 2R1 2B1 2STORE 4LOAD 4R0 4B0 4R1 4B1 4STORE",
        "1LOAD 1F0 1B0 1F1 1B1 1STORE 3LOAD 3R0 3B0 3R1 3B1 3STORE",
    )
    assert lowered == generate("roundrobin", num_ranks=2, num_microbatches=2, num_layers=4)
    validate(bare)
    validate(lowered)


def test_add_weight_transfers_refuses_stage_bound_and_repeats():
    with pytest.raises(ValueError, match="round-robin pool"):
        add_weight_transfers(generate("1f1b", num_ranks=2, num_microbatches=2))
    with pytest.raises(ValueError, match="only once"):
        add_weight_transfers(generate("roundrobin", num_ranks=2, num_microbatches=2))
