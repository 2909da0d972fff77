"""``held_jobs``: per action of one device's row, the jobs whose weights the pool holds (its prefetch and
release), on hand-written rows with the answers worked out by hand from the rule: a job is held from its
first action to its last on the device, and the next job not yet started is held too while fewer than
two jobs are open."""

from bubbleless_schedules import Schedule, held_jobs
from bubbleless_schedules.action import Action
from bubbleless_schedules.roundrobin_layout import held_weights, peak_weight_layers


def _row(text: str) -> list[Action]:
    return [Action.parse(word) for word in text.split()]


def test_an_in_order_row_holds_the_current_job_and_prefetches_the_next():
    # job 0 open, 1 prefetched; 0 ends at 0F1, so 1 (open from 1F0) has 2 prefetched; 2 is the last job
    assert held_jobs(_row("0F0 0F1 1F0 1F1 2F0 2F1")) == [(0, 1), (0, 1), (1, 2), (1, 2), (2,), (2,)]


def test_a_later_started_job_that_ends_first_leaves_before_the_earlier_one():
    # 0 and 1 open from 1F0 (no prefetch with two open); 1 ends at 1F1 and goes, 0 stays to its 0F1
    assert held_jobs(_row("0F0 1F0 1F1 0F1")) == [(0, 1), (0, 1), (0, 1), (0,)]


def test_the_next_job_is_prefetched_into_the_room_a_job_leaves():
    # 1 and 2 open at 2F0; 2 ends first (held through its last action, 2F1) and 3 comes into its room
    # while 1 is still open, at 1B0; then 1 goes and 3 is the device's last job
    row = _row("0F0 0F1 1R0 2F0 2F1 1B0 3F0 3F1")
    assert held_jobs(row) == [(0, 1), (0, 1), (1, 2), (1, 2), (1, 2), (1, 3), (3,), (3,)]


def test_a_third_job_started_while_two_are_open_is_held_with_them():
    # the order the generator refuses: 2 starts before 0 or 1 ends, so three jobs' weights at 2F0
    assert held_jobs(_row("0F0 1F0 2F0 0F1 1F1 2F1")) == [(0, 1), (0, 1), (0, 1, 2), (0, 1, 2), (1, 2), (2,)]


def test_a_job_of_one_action_is_open_for_that_action_only():
    assert held_jobs(_row("0F0 1F0 2F0")) == [(0, 1), (1, 2), (2,)]
    assert held_jobs([]) == []


def test_held_weights_and_peak_weight_layers_are_the_rule_s_maxima():
    """Jobs 0..4 hold 1, 3, 2, 1 and 3 layers (forward groups 1 and 3, fused last 2, backward 3 and 1 run
    last-to-first). Device 0 defers job 2's W past job 3, which it ends first: job 4 (3 layers) is
    prefetched into job 3's room beside job 2 (2), 5 layers, more than any two jobs it starts in a row
    (jobs 0 and 2, 2 and 3: 3 each). Device 1 runs job 1 alone: 3 layers, one job open."""
    schedule = Schedule.from_text(
        "# bubbleless-schedule name=roundrobin stages=5 microbatches=2 layout=roundrobin "
        "meta.forward_layers=1,3 meta.last_layers=2 meta.backward_layers=3,1\n"
        "0F0 0F1 2F0 2I0 2F1 2I1 3R0 3B0 3R1 3B1 2W0 2W1 4R0 4B0 4R1 4B1\n1F0 1F1\n")
    assert held_jobs(schedule.actions[0]) == [(0, 2)] * 2 + [(2, 3)] * 8 + [(2, 4)] * 2 + [(4,)] * 4
    assert held_jobs(schedule.actions[1]) == [(1,), (1,)]
    assert peak_weight_layers(schedule) == (5, 3)
    assert held_weights(schedule) == (2, 5)  # two jobs open at once (2 and 3), the prefetched 4 not counted


def test_held_weights_counts_open_jobs_not_the_prefetched_one():
    """In-order devices hold two jobs' weights (the current and the prefetched next) with one job open:
    device 0 jobs 2 and 4 (2 + 3 layers), device 1 jobs 1 and 3 (3 + 1)."""
    schedule = Schedule.from_text(
        "# bubbleless-schedule name=roundrobin stages=5 microbatches=2 layout=roundrobin "
        "meta.forward_layers=1,3 meta.last_layers=2 meta.backward_layers=3,1\n"
        "0F0 0F1 2F0 2B0 2F1 2B1 4R0 4B0 4R1 4B1\n1F0 1F1 3R0 3B0 3R1 3B1\n")
    assert held_jobs(schedule.actions[0]) == [(0, 2)] * 2 + [(2, 4)] * 4 + [(4,)] * 4
    assert held_jobs(schedule.actions[1]) == [(1, 3)] * 2 + [(3,)] * 4
    assert peak_weight_layers(schedule) == (5, 4)
    assert held_weights(schedule) == (1, 5)
