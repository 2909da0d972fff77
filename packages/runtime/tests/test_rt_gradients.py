"""Every stage-bound schedule gives the unpipelined model's loss and gradients (2 and 4 gloo ranks)."""

from __future__ import annotations

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime._testing.ranks import check_against_unpipelined

TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize(("num_ranks", "num_microbatches"), [(2, 4), (4, 8)])
def test_rt_every_schedule_matches_unpipelined(num_ranks, num_microbatches):
    per_rank = spawn(check_against_unpipelined, num_ranks, num_microbatches, threads_per_process=1, timeout=240)
    names = set(per_rank[0]["results"])
    assert {"gpipe", "1f1b", "split-1f1b", "v-gpipe"} <= names
    for rank, report in enumerate(per_rank):
        assert set(report["results"]) == names
        for name, result in report["results"].items():
            assert result["grad_error"] <= TOLERANCE, (rank, name, result)
            assert result["spans"] == result["expected_spans"], (rank, name, result)
            if result["holds_loss"]:
                assert result["loss_error"] <= TOLERANCE, (rank, name, result)
            else:
                assert result["loss_error"] is None, (rank, name, result)
    assert sum(report["results"]["gpipe"]["holds_loss"] for report in per_rank) == 1
    assert set(per_rank[0]["skipped"]) <= {"roundrobin"}, per_rank[0]["skipped"]
