"""metrics.jsonl and TensorBoard: a line per step, flushed as written, resumed without duplicated steps."""

from __future__ import annotations

import json
import math

import pytest

from bubbleless_runtime.metrics import (
    METRICS_FILE,
    TENSORBOARD_DIR,
    MetricsWriter,
    open_metrics,
    read_metrics,
)


def lines_of(directory):
    return [json.loads(line) for line in (directory / METRICS_FILE).read_text().splitlines()]


def test_each_step_is_a_flushed_line_with_optional_fields(tmp_path):
    with MetricsWriter(tmp_path / "out", tensorboard=False) as metrics:
        metrics.log(1, loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_second=100.0)
        # readable before close: a killed run keeps what it wrote
        assert lines_of(tmp_path / "out") == [
            {"step": 1, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_second": 100.0}
        ]
        metrics.log(2, loss=2.0, lr=1e-3, grad_norm=math.nan, tokens_per_second=None, eval_loss=2.25)
    assert lines_of(tmp_path / "out")[1] == {"step": 2, "loss": 2.0, "lr": 1e-3, "grad_norm": None, "eval_loss": 2.25}
    assert not (tmp_path / "out" / TENSORBOARD_DIR).exists()


def test_a_fresh_run_starts_a_new_file(tmp_path):
    for _ in range(2):
        with MetricsWriter(tmp_path, tensorboard=False) as metrics:
            metrics.log(1, loss=1.0)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


def test_resume_drops_the_steps_about_to_run_again(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as metrics:
        for step in range(1, 6):
            metrics.log(step, loss=10.0 - step)
    with open(tmp_path / METRICS_FILE, "a") as file:
        file.write('{"step": 6, "lo')  # the line a kill cut short
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    with MetricsWriter(tmp_path, resume_step=3, tensorboard=False) as metrics:  # the checkpoint was at 3
        for step in range(4, 7):
            metrics.log(step, loss=0.5)
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records] == [9.0, 8.0, 7.0, 0.5, 0.5, 0.5]


def test_a_broken_line_in_the_middle_names_file_and_line(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a JSON line"):
        read_metrics(tmp_path)


def test_misuse_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="before open"):
        MetricsWriter(tmp_path).log(1, loss=1.0)
    with pytest.raises(ValueError, match="resume_step"):
        MetricsWriter(tmp_path, resume_step=-1)


def test_only_rank_zero_writes(tmp_path):
    assert open_metrics(tmp_path / "r1", rank=1) is None
    writer = open_metrics(tmp_path / "r0", rank=0)
    writer.log(1, loss=1.0)
    writer.close()
    assert read_metrics(tmp_path / "r0") == [{"step": 1, "loss": 1.0}]


def test_tensorboard_gets_the_same_scalars_and_resume_purges(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path) as metrics:
        assert metrics.tensorboard is not None
        for step in range(1, 5):
            metrics.log(step, loss=float(step), eval_loss=None if step % 2 else 10.0 + step)
    with MetricsWriter(tmp_path, resume_step=2) as metrics:
        metrics.log(3, loss=30.0)
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "eval/loss"}
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, 12.0)]


@pytest.mark.slow
def test_train_writes_a_line_per_step_and_a_resume_does_not_repeat_steps(tmp_path):
    from bubbleless_runtime import _testing as testing

    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4,\n"
        "        num_kv_heads: 2, head_dim: 8}\ndata: {task: copy, num_symbols: 8, length: 4, batch_size: 8}\n"
        "pipeline: {schedule: 1f1b, nproc: 1, num_microbatches: 2}\ntrain: {steps: 4, save_every: 2}\n"
    )
    out = tmp_path / "out"
    for extra in ([], ["--resume", str(out / "checkpoint-2")]):
        done = testing.run_cli(["train", str(config), "--output-dir", str(out), *extra])
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        records = read_metrics(out)
        assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(set(r) == {"step", "loss", "lr", "grad_norm", "tokens_per_second"} for r in records)
    assert all(r["loss"] > 0 and r["tokens_per_second"] > 0 and r["grad_norm"] > 0 for r in records)
    assert f"loss curve    {out / 'loss.png'}" in done.stdout  # the report draws these steps
    assert (out / "loss.png").stat().st_size > 5000
