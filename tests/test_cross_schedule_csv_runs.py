"""schedules -> CSV -> a hand edit -> runtime: a schedule file is something a user can change and run.

A generated ZB-H1 schedule is saved to CSV, edited as text the way a person would (two independent
actions on rank 1 swap places: a weight-gradient W of micro-batch 0 moves after the forward of
micro-batch 2), loaded back, validated, and run on a real 2-rank gloo ``Pipeline``. The gradients must
equal the unpipelined model's, and the ranks must have run the edited order, not the generated one.
"""

from __future__ import annotations

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime._testing.cross import csv_schedule_against_unpipelined
from bubbleless_schedules import Schedule, generate, simulate, validate

TOLERANCE = 1e-5


def _swap_on_row(csv_text: str, row: int, first: str, second: str) -> str:
    """Swap two adjacent actions of one rank's row, as an edit in a text editor would."""
    lines = csv_text.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("#")]
    index = header[-1] + 1 + row
    actions = lines[index].split(",")
    at = actions.index(first)
    assert actions[at + 1] == second, f"{first},{second} are not adjacent on row {row}: {lines[index]}"
    actions[at], actions[at + 1] = second, first
    lines[index] = ",".join(actions)
    return "\n".join(lines) + "\n"


def test_cross_a_hand_edited_schedule_is_a_valid_different_schedule():
    generated = generate("zb-h1", num_ranks=2, num_microbatches=4)
    edited = Schedule.from_csv(_swap_on_row(generated.to_csv(), 1, "1W0", "1F2"))
    validate(edited)
    assert edited.actions[0] == generated.actions[0] and edited.actions[1] != generated.actions[1]
    assert simulate(edited).makespan > 0  # the simulator takes the edited order (no deadlock)


def test_cross_an_edit_that_breaks_a_dependency_is_refused():
    broken = Schedule.from_csv(_swap_on_row(generate("zb-h1", num_ranks=2, num_microbatches=4).to_csv(), 1, "1F0", "1I0"))
    with pytest.raises(ValueError, match=r"deadlock: .*worker 1 waits at 1I0 for \(F, 1, 0\)"):  # I before its F
        validate(broken)


@pytest.mark.slow
def test_cross_edited_csv_schedule_runs_on_two_ranks_with_the_unpipelined_gradients():
    edited = _swap_on_row(generate("zb-h1", num_ranks=2, num_microbatches=4).to_csv(), 1, "1W0", "1F2")
    per_rank = spawn(csv_schedule_against_unpipelined, 2, edited, threads_per_process=1, timeout=120)
    for rank, result in enumerate(per_rank):
        assert result["grad_error"] <= TOLERANCE, (rank, result)
    assert per_rank[1]["loss_error"] <= TOLERANCE and per_rank[0]["loss_error"] is None
    ran = per_rank[1]["ran"]
    assert ran.index("1F2") < ran.index("1W0"), ran  # the edited order is what ran
