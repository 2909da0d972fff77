"""A minimal communication lowering, private to the runtime.

TODO: use ``bubbleless_schedules.lowering`` (being written in the schedules package) once it exists;
this stays only as the fallback the executor needs meanwhile.

Rule: on each rank, after a compute action come the sends of what it produced, then the receives the
*next* compute action consumes. So every receive is posted one compute action ahead of its consumer
(overlapping the transfer with that action) and waited just before the consumer; the sends and
receives between two compute actions form one batch. Sends never block (they are waited at the end of
the step) and tags are unique per message, so on gloo no posting order can deadlock a valid schedule.
"""

from __future__ import annotations

from bubbleless_schedules import Action, Kind, Schedule


def _receives(action: Action, owner, rank: int, last: int) -> list[Action]:
    s, m = action.stage, action.microbatch
    if action.kind is Kind.F and s > 0 and owner[s - 1] != rank:
        return [Action(s, Kind.RECV_F, m)]
    if action.kind in (Kind.I, Kind.B) and s < last and owner[s + 1] != rank:
        return [Action(s, Kind.RECV_B, m)]
    return []


def _sends(action: Action, owner, rank: int, last: int) -> list[Action]:
    s, m = action.stage, action.microbatch
    if action.kind is Kind.F and s < last and owner[s + 1] != rank:
        return [Action(s, Kind.SEND_F, m)]
    if action.kind in (Kind.I, Kind.B) and s > 0 and owner[s - 1] != rank:
        return [Action(s, Kind.SEND_B, m)]
    return []


def add_communication(schedule: Schedule) -> Schedule:
    """The schedule with SEND_F/RECV_F/SEND_B/RECV_B added around each rank's compute actions."""
    owner, last = schedule.stage_to_rank, schedule.num_stages - 1
    lowered = []
    for rank, actions in enumerate(schedule.actions):
        row: list[Action] = []
        if actions:
            row += _receives(actions[0], owner, rank, last)
        for k, action in enumerate(actions):
            row.append(action)
            row += _sends(action, owner, rank, last)
            if k + 1 < len(actions):
                row += _receives(actions[k + 1], owner, rank, last)
        lowered.append(tuple(row))
    return schedule.replace(actions=tuple(lowered))
