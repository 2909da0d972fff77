"""Communication that cannot hang: a dead rank or a mismatched schedule raises everywhere, in time."""

from __future__ import annotations

import json

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime.testing_ranks import disagree_on_schedule, survive_a_dead_rank

TIMEOUT = 4.0


@pytest.mark.slow
def test_rt_dead_rank_makes_every_survivor_raise_within_the_timeout(tmp_path):
    with pytest.raises(RuntimeError, match="rank 1 exited with code 17"):
        spawn(survive_a_dead_rank, 4, 1, TIMEOUT, str(tmp_path), threads_per_process=1, grace=3 * TIMEOUT)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 2, 3)]
    for report in reports:
        assert report["type"] == "PipelineCommError", report
        assert report["elapsed"] < TIMEOUT + 2.0, report
        assert "A rank died or stalled" in report["error"]
    assert any("pipeline rank 1" in r["error"] for r in reports)


@pytest.mark.slow
def test_rt_mismatched_schedule_raises_value_error_on_every_rank():
    messages = spawn(disagree_on_schedule, 3, threads_per_process=1, timeout=60)
    for message in messages:
        assert "disagree with rank 0" in message and "[1]" in message, message
