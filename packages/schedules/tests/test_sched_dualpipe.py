"""DualPipeV: valid for every supported shape, p + 1/2 M_B peak, the ZB-V bubble at unit costs, and
never slower than the published order it chooses among."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs, Kind, generate, peak_memory, simulate
from bubbleless_schedules.generators.dualpipe import SPLITS, dualpipev_schedule


@pytest.mark.parametrize("p", range(1, 9))
def test_every_supported_shape_validates_at_p_plus_half_memory(p):
    for m in sorted({2 * p, 2 * p + 1, 3 * p}):
        schedule = generate("dualpipev", num_ranks=p, num_microbatches=m)  # generate() validates
        assert max(peak_memory(schedule)) == p + 0.5
        timeline = simulate(schedule)
        assert timeline.bubble_rate == pytest.approx((p - 1) / (6 * m + p - 1), abs=1e-12)


def test_too_few_microbatches_names_the_constraint():
    with pytest.raises(ValueError, match="at least 2 \\* num_ranks = 8 micro-batches"):
        generate("dualpipev", num_ranks=4, num_microbatches=7)


def test_overlapped_pairs_are_adjacent_forward_then_backward():
    schedule = dualpipev_schedule(4, 12)
    row = schedule.actions[1]  # rank 1: stages 1 and 6
    pairs = [(a, b) for a, b in zip(row, row[1:], strict=False) if a.kind is Kind.F and b.kind is Kind.B]
    assert any(a.stage == 1 and b.stage == 6 for a, b in pairs)  # F0 with B1
    assert any(a.stage == 6 and b.stage == 1 for a, b in pairs)  # F1 with B0


@pytest.mark.parametrize(
    "costs", [Costs(18.5, 18.1, 9.3, 0.6), Costs(18.5, 18.1, 9.3, 9.25), Costs(18.5, 18.1, 4.0, 0.6)]
)
def test_cost_aware_choice_is_never_slower_than_any_split(costs):
    for p, m in ((4, 8), (4, 24), (8, 24)):
        ours = simulate(generate("dualpipev", num_ranks=p, num_microbatches=m, costs=costs), costs).makespan
        for split in SPLITS:
            assert ours <= simulate(dualpipev_schedule(p, m, split), costs).makespan + 1e-6


def test_memory_limit_below_its_peak_is_refused():
    with pytest.raises(ValueError, match="memory_limit"):
        generate("dualpipev", num_ranks=4, num_microbatches=8, memory_limit=4)
