"""Communication that cannot hang: a dead rank or a mismatched schedule raises everywhere, in time."""

from __future__ import annotations

import json

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime._testing.ranks import disagree_on_schedule, survive_a_dead_rank

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


def test_rt_gloo_transfers_use_one_group_per_direction():
    """Opposite transfers between two ranks must not share a gloo pair (simultaneous sends over one pair
    stall for milliseconds), and both ends of every transfer must pick the same group."""
    from bubbleless_runtime._testing.ranks import transfer_groups

    per_rank = spawn(transfer_groups, 3, threads_per_process=1, timeout=120)
    for rank, groups in enumerate(per_rank):
        assert groups["twin_reused"]
        for peer in groups["send"]:
            assert groups["send"][peer] != groups["receive"][peer], (rank, peer, groups)
            assert groups["send"][peer] == per_rank[peer]["receive"][rank], (rank, peer)
    upward = {g["send"][peer] for rank, g in enumerate(per_rank) for peer in g["send"] if peer > rank}
    downward = {g["send"][peer] for rank, g in enumerate(per_rank) for peer in g["send"] if peer < rank}
    assert len(upward) == len(downward) == 1 and upward != downward


def test_rt_a_pipeline_is_freed_without_the_cycle_collector():
    """No reference cycle keeps an executor (and the process groups its channel holds) alive after its
    pipeline is dropped, so they go at once rather than whenever the cycle collector runs."""
    import gc
    import weakref

    from bubbleless_runtime import Pipeline
    from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model

    gc.disable()
    try:
        pipe = Pipeline(tiny_model(3), schedule="1f1b", num_microbatches=2, loss_fn=tiny_loss)
        pipe.step(*tiny_batch(4))
        refs = [weakref.ref(pipe), weakref.ref(pipe._executor)]
        del pipe
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()
