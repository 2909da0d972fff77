"""Trainer over a real 2-rank gloo Pipeline: the same losses as one process, and exact resume.

The model ties its embedding and LM head, which 1F1B on 2 ranks puts on different ranks, so matching
the one-process run checks the cross-rank gradient sum and the global-norm clipping as well.
"""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime._testing import SequentialPipeline, free_port, tiny_hf_fields  # noqa: E402
from bubbleless_runtime.config import OptimizerConfig  # noqa: E402
from bubbleless_runtime.data import SyntheticTask  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402
from bubbleless_runtime.trainer import ScaledLoss, Trainer, build_optimizer, seed_everything, warmup_cosine  # noqa: E402

TINY = tiny_hf_fields(tie_word_embeddings=True)
TASK = SyntheticTask(task="reverse", num_symbols=8, length=4, batch_size=8, seed=5)
MICROBATCHES = 4


def make_trainer(make_pipeline, *, seed=0):
    seed_everything(seed)
    piped = pipeline_model(build_causal_lm("qwen3", seed=seed, **TINY))
    loss = ScaledLoss(piped.loss_fn)
    pipe = make_pipeline(piped.layers, loss)
    optimizer = build_optimizer(pipe.parameters(), OptimizerConfig(lr=1e-2, warmup_steps=2))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(warmup_steps=2, total_steps=8, min_lr_ratio=0.1)
    )
    return Trainer(
        pipeline=pipe, layers=piped.layers, loss=loss, optimizer=optimizer, scheduler=scheduler,
        num_microbatches=MICROBATCHES, max_grad_norm=0.5, group=getattr(pipe, "group", None),
    )  # fmt: skip


def _pipelined(layers, loss):
    from bubbleless_runtime.pipeline import Pipeline

    return Pipeline(layers, schedule="1f1b", num_microbatches=MICROBATCHES, loss_fn=loss)


def _worker(rank, port, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        straight = make_trainer(_pipelined)
        uninterrupted = [straight.train_step(TASK) for _ in range(4)]
        first = make_trainer(_pipelined)
        interrupted = [first.train_step(TASK).loss for _ in range(2)]
        first.save(os.path.join(out, "ckpt"))
        resumed = make_trainer(_pipelined, seed=99)  # other initial weights: load() must replace them all
        resumed.load(os.path.join(out, "ckpt"))
        interrupted += [resumed.train_step(TASK).loss for _ in range(2)]
        if rank == 0:
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump({
                    "losses": [s.loss for s in uninterrupted], "norms": [s.grad_norm for s in uninterrupted],
                    "resumed": interrupted,
                }, f)  # fmt: skip
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_training_matches_one_process_and_resumes_exactly(tmp_path):
    import torch.multiprocessing as mp

    port = free_port()
    # fork: test modules are imported by path (importlib mode), so spawn could not pickle the worker.
    mp.start_processes(_worker, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    result = json.loads((tmp_path / "result.json").read_text())

    reference = make_trainer(lambda layers, loss: SequentialPipeline(layers, loss, MICROBATCHES))
    expected = [reference.train_step(TASK) for _ in range(4)]
    assert result["losses"] == pytest.approx([s.loss for s in expected], rel=1e-5)
    assert result["norms"] == pytest.approx([s.grad_norm for s in expected], rel=1e-4)
    assert expected[0].grad_norm > 0.5  # clipping was active, so the norm had to be right
    assert result["resumed"] == result["losses"]


def _stop_worker(rank, port, out):
    """Rank 1 alone is signalled after its first step; both ranks count their all-reduces per step."""
    import signal

    import torch.distributed as dist

    from bubbleless_runtime.signals import StopRequest

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    counted = {"all_reduce": 0}
    real_all_reduce = dist.all_reduce

    def counting(*args, **kwargs):
        counted["all_reduce"] += 1
        return real_all_reduce(*args, **kwargs)

    dist.all_reduce = counting
    try:
        plain = make_trainer(_pipelined)
        plain_stats, plain_counts = [], []
        for _ in range(3):
            counted["all_reduce"] = 0
            plain_stats.append(plain.train_step(TASK))
            plain_counts.append(counted["all_reduce"])
        stop = StopRequest()  # not installed: the test sets what a signal handler would record
        stopping = make_trainer(_pipelined)
        stats, counts = [], []
        for step in range(3):
            if rank == 1 and step == 1:
                stop.signum = signal.SIGTERM
            counted["all_reduce"] = 0
            stats.append(stopping.train_step(TASK, stop=stop))
            counts.append(counted["all_reduce"])
        with open(os.path.join(out, f"stop{rank}.json"), "w") as f:
            json.dump({
                "signals": [s.stop_signal for s in stats], "losses": [s.loss for s in stats],
                "plain_signals": [s.stop_signal for s in plain_stats], "plain_losses": [s.loss for s in plain_stats],
                "counts": counts, "plain_counts": plain_counts,
            }, f)  # fmt: skip
    finally:
        dist.all_reduce = real_all_reduce
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_stop_signal_on_one_rank_reaches_every_rank_on_the_loss_all_reduce(tmp_path):
    """Rank 1 records SIGTERM before step 2: both ranks' step 2 (not step 1) reports it, the losses are
    those of a run without a stop request, and a step makes no more all-reduces than without one."""
    import signal

    import torch.multiprocessing as mp

    port = free_port()
    mp.start_processes(_stop_worker, args=(port, str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [json.loads((tmp_path / f"stop{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        assert got["signals"] == [None, signal.SIGTERM, signal.SIGTERM], got
        assert got["plain_signals"] == [None, None, None]
        assert got["losses"] == got["plain_losses"]
        assert got["counts"] == got["plain_counts"] and min(got["counts"]) >= 1, got
    assert ranks[0]["losses"] == ranks[1]["losses"]
