"""Interleaved 1F1B: Megatron's closed form at unit costs, its memory, its shape rule, and v=1 == 1F1B."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bubbleless_schedules import Costs, Kind, generate, simulate
from bubbleless_schedules.generators.interleaved import round_size


def interleaved(p: int, m: int, v: int = 2, **kw):
    return generate("interleaved-1f1b", num_ranks=p, num_microbatches=m, chunks_per_rank=v, **kw)


@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8), (4, 16), (8, 24), (8, 32), (3, 9)])
def test_bubble_closed_form_at_unit_costs(p, m, v):
    """(p-1)/(v m + p-1): the ramp is (p-1) chunk slots of 1/v of a rank's work each."""
    timeline = simulate(interleaved(p, m, v))
    assert timeline.bubble_rate == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert timeline.bubble_rate < simulate(generate("1f1b", num_ranks=p, num_microbatches=m)).bubble_rate or p == 1


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 7, 2), (8, 24, 2), (8, 24, 4), (5, 3, 3)])
def test_placement_and_peak_memory(p, m, v):
    schedule = interleaved(p, m, v)
    assert schedule.stage_to_rank == tuple(s % p for s in range(p * v))
    assert {a.kind for row in schedule.actions for a in row} == {Kind.F, Kind.B}
    group = round_size(p, m)
    expected = min(m, ((v - 1) * group + 2 * (p - 1) + 1) / v)  # rank 0's warm-up plus one, 1/v M_B each
    assert simulate(schedule).max_peak_memory == pytest.approx(expected)


def test_chunks_run_in_rounds_of_p():
    """Rank 0 of p=2, m=4: two forwards of chunk 0 (stage 0), then two of chunk 1 (stage 2), per round."""
    first_row = str(interleaved(2, 4)).splitlines()[1].split()
    assert first_row[:5] == ["0F0", "0F1", "2F0", "2F1", "0F2"]


def test_one_chunk_is_1f1b():
    for p, m in [(1, 1), (3, 5), (4, 9)]:
        assert interleaved(p, m, 1).actions == generate("1f1b", num_ranks=p, num_microbatches=m).actions


@pytest.mark.parametrize("p,m", [(4, 9), (4, 13), (8, 17)])
def test_refuses_uneven_rounds_and_says_what_to_use(p, m):
    with pytest.raises(ValueError, match=f"multiple of {p}"):
        interleaved(p, m)


@pytest.mark.parametrize("v", [0, -1, 1.5, True])
def test_refuses_bad_chunk_counts(v):
    with pytest.raises(ValueError, match="chunks_per_rank"):
        interleaved(4, 8, v)


def test_per_stage_costs_cover_every_chunk():
    forward = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # p=3, v=2: six stages
    costs = Costs(forward, [1.0] * 6, [0.5] * 6)
    timeline = simulate(interleaved(3, 6, 2, costs=costs), costs)
    for span in timeline.spans:
        if span.action.kind is Kind.F:
            assert span.end - span.start == forward[span.action.stage]
    with pytest.raises(ValueError, match="per-stage"):
        simulate(interleaved(3, 6, 2), Costs([1.0] * 3, [1.0] * 3, [1.0] * 3))


REFERENCE_FILE = Path(__file__).resolve().parents[3] / "bench" / "schedules" / "reference_zb.py"


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 24)])
def test_same_order_as_megatron_where_megatron_applies(p, m):
    if not REFERENCE_FILE.exists():
        pytest.skip(f"{REFERENCE_FILE} is not in this checkout")
    spec = importlib.util.spec_from_file_location("reference_zb_for_interleaved_tests", REFERENCE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    theirs = module.REFERENCE["interleaved-1f1b"](num_ranks=p, num_microbatches=m, costs=None, memory_limit=None)
    assert interleaved(p, m).actions == theirs.actions
