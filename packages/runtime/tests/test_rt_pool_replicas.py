"""Data parallelism across round-robin pools (``pool_replicas``): two replicas of 2 CPU devices each over
gloo, on different batches, against plain torch on the unpipelined model fed the replicas' mean gradient."""

from __future__ import annotations

import pytest
import torch

from bubbleless_runtime import spawn
from bubbleless_runtime._testing import tiny_loss, tiny_model
from bubbleless_runtime._testing.replicas import against_unpipelined, one_replica_stalls, other_models
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_replicas import _buckets


@pytest.mark.slow
def test_rt_pool_replicas_average_gradients_and_stay_identical_sync_accumulated_and_overlapped():
    per_rank = spawn(against_unpipelined, 2, threads_per_process=1, timeout=300)
    for rank, found in enumerate(per_rank):
        assert found["replicas differ"] > 1e-2, (rank, found)  # averaging is not a no-op here
        for mode in ("grad", "synchronous", "overlapped"):
            assert found[mode] <= 1e-5, (rank, mode, found)
    for mode in ("synchronous checksum", "overlapped checksum"):
        assert per_rank[0][mode] == per_rank[1][mode], mode  # bit for bit: no broadcast needed


@pytest.mark.slow
def test_rt_pool_replicas_a_stalled_replica_fails_the_step_in_time_and_drops_its_gradients():
    found = spawn(one_replica_stalls, 2, 5.0, threads_per_process=1, timeout=120)[0]
    assert "all-reduce" in found["message"] and "timeout=5s" in found["message"], found
    assert found["seconds"] < 60, found
    assert found["left"] == 0.0, found


@pytest.mark.slow
def test_rt_pool_replicas_of_other_models_are_refused_at_construction():
    for message in spawn(other_models, 2, threads_per_process=1, timeout=120):
        assert "replica(s) [1] hold other trainable parameters" in message, message
        assert "every replica must build the same model" in message, message


def test_rt_pool_replicas_refuse_a_group_without_torch_distributed():
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        RoundRobinPipeline(tiny_model(3), devices=["cpu"], num_microbatches=2, loss_fn=tiny_loss, partition="even",
                           data_parallel_group=object())


def test_rt_pool_replicas_buckets_small_tensors_together_and_large_ones_alone():
    small, other = torch.zeros(4), torch.zeros(4, dtype=torch.float64)
    large = torch.zeros(64)
    buckets = _buckets([small, small, large, small, other, small], limit=64 * 4)
    assert [[t.numel() for t in b] for b in buckets] == [[4, 4], [64], [4], [4], [4]]
    assert [b[0].dtype for b in buckets] == [torch.float32, torch.float32, torch.float32, torch.float64,
                                             torch.float32]


@pytest.mark.slow
def test_rt_pool_replicas_under_torchrun_the_cli_trains_one_pool_per_rank_rank_0_writing(tmp_path):
    from bubbleless_runtime._testing.replicas import REPLICA_CONFIG, cli_replica

    config = tmp_path / "replicas.yaml"
    config.write_text(REPLICA_CONFIG)
    out = tmp_path / "out"
    first = spawn(cli_replica, 2, str(config), str(out), [], threads_per_process=1, timeout=600)
    assert [r["code"] for r in first] == [0, 0], first
    assert [r["replicas"] for r in first] == [2, 2]
    assert first[0]["checksum"] == first[1]["checksum"]  # the same weights, never broadcast
    assert {"checkpoint-4", "checkpoint-8", "metrics.jsonl"} <= set(first[0]["files"]), first[0]["files"]
    assert "2 data-parallel pools of 2 devices" in first[0]["printed"], first[0]["printed"][-800:]
    assert first[1]["printed"] == "", first[1]["printed"][-500:]  # rank 0 reports
    # both replicas resume from replica 0's checkpoint-4 and end where the run without a break did
    again = spawn(cli_replica, 2, str(config), str(tmp_path / "again"), ["--resume", str(out / "checkpoint-4")],
                  threads_per_process=1, timeout=600)
    assert again[0]["checksum"] == again[1]["checksum"] == first[0]["checksum"]
    # and averaging changed the training: one pool alone (every batch in turn) ends elsewhere
    alone = spawn(cli_replica, 1, str(config), str(tmp_path / "alone"), [], threads_per_process=1, timeout=600)
    assert alone[0]["replicas"] is None and alone[0]["checksum"] != first[0]["checksum"]
