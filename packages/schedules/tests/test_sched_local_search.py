"""The local searches of generators/local_search.py on a literal order: where adjacent swaps stop on a
plateau, moving one action two places crosses it (issue 11: zbv at p=2 m=2, 1.5B profile)."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs, Schedule, simulate
from bubbleless_schedules.generators.local_search import (
    adjacent_swaps,
    independent,
    schedule_evaluator,
    schedule_fits,
    shifts,
)

PAPER = Costs(18.5, 18.1, 9.3, 0.6)
BEFORE = """\
# bubbleless-schedule name=zbv stages=4 microbatches=2 placement=0,1,1,0 layout=pipeline
0F0 0F1 3F0 3I0 3F1 3I1 3W0 0I0 3W1 0W0 0I1 0W1
1F0 2F0 1F1 2F1 2I0 1I0 2I1 1I1 2W0 1W0 2W1 1W1
"""
AFTER_RANK_1 = "1F0 2F0 1F1 2F1 2I0 1I0 2W0 2I1 1I1 1W0 2W1 1W1"
"""What sail-sg's greedy zbv finds (bench/schedules/published_v_zbv.py): 2W0 two places earlier."""


def _search(schedule: Schedule, search):
    return search(schedule.actions, schedule_evaluator(schedule, PAPER), can_swap=independent,
                  fits=schedule_fits(schedule, 2.0))


def test_adjacent_swaps_stop_where_one_move_of_two_places_helps():
    before = Schedule.from_text(BEFORE)
    assert simulate(before, PAPER).makespan == pytest.approx(103.05)
    rows, makespan = _search(before, adjacent_swaps)
    assert makespan == pytest.approx(103.05) and [list(r) for r in rows] == [list(r) for r in before.actions]
    rows, makespan = _search(before, shifts)
    assert makespan == pytest.approx(103.0)
    assert " ".join(str(a) for a in rows[1]) == AFTER_RANK_1
    assert simulate(before.replace(actions=rows), PAPER).makespan == pytest.approx(103.0)


def test_shifts_never_pass_an_action_that_depends_on_the_moved_one():
    before = Schedule.from_text(BEFORE)
    rows, _ = _search(before, shifts)
    for row in rows:  # each I still after its F, each W after its I, on the rank that runs both
        seen = set()
        for action in row:
            need = {"I": "F", "W": "I"}.get(action.kind.value)
            if need and any(a.stage == action.stage for a in row):
                assert (action.stage, need, action.microbatch) in seen, (action, row)
            seen.add((action.stage, action.kind.value, action.microbatch))
