"""The final report's loss curve: train and eval loss from metrics.jsonl as a PNG, listed in the report."""

from __future__ import annotations

import math
import types

import pytest

from bubbleless_runtime.config import load_config
from bubbleless_runtime.metrics import MetricsWriter
from bubbleless_runtime.report import RunResult, finish, loss_records, plot_losses, report, write_loss_curve

pytest.importorskip("matplotlib", reason="the [cli] extra is not installed")

RECORDS = [
    {"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5, "eval_loss": 2.8}, {"step": 3, "loss": None},
    {"step": 4, "loss": 1.5, "eval_loss": 2.0},
]


def test_the_curve_has_train_and_eval_lines_over_steps():
    axes = plot_losses(RECORDS).axes[0]
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert set(lines) == {"train loss", "eval loss"}
    assert list(lines["train loss"].get_xdata()) == [1, 2, 4]  # the step without a loss (NaN) is left out
    assert list(lines["train loss"].get_ydata()) == [3.0, 2.5, 1.5]
    assert list(lines["eval loss"].get_xdata()) == [2, 4] and list(lines["eval loss"].get_ydata()) == [2.8, 2.0]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["train loss", "eval loss"]
    assert axes.get_xlabel() == "optimizer step" and axes.get_title() == "loss (train and eval)"


def test_without_eval_only_the_train_line():
    axes = plot_losses([{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]).axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["train loss"]
    assert axes.get_title() == "loss (train)"


def test_the_png_is_written_and_nothing_without_records(tmp_path):
    path = write_loss_curve(RECORDS, str(tmp_path / "deep" / "loss.png"))
    data = (tmp_path / "deep" / "loss.png").read_bytes()
    assert path.endswith("loss.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert write_loss_curve([], str(tmp_path / "none.png")) is None and not (tmp_path / "none.png").exists()


def test_records_come_from_metrics_or_else_from_the_losses(tmp_path):
    assert loss_records(str(tmp_path), [2.0, 1.0]) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
    with MetricsWriter(tmp_path, tensorboard=False) as metrics:
        metrics.log(7, loss=0.25, eval_loss=0.5)
    assert loss_records(str(tmp_path), [2.0]) == [{"step": 7, "loss": 0.25, "eval_loss": 0.5}]


def test_finish_draws_the_curve_on_rank_zero_and_the_report_lists_it(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as metrics:
        for step, loss in enumerate([3.0, 2.0, 1.0, 0.5], 1):
            metrics.log(step, loss=loss, eval_loss=loss + 0.5 if step % 2 == 0 else None)
    no_timeline = types.SimpleNamespace(last_timeline=None)  # the curve needs no trace of the pipeline
    other = finish(1, no_timeline, [3.0, 2.0, 1.0, 0.5], 100.0, str(tmp_path / "r1"), None, None, 4)
    assert other.loss_png is None and not (tmp_path / "r1").exists()
    result = finish(0, no_timeline, [3.0, 2.0, 1.0, 0.5], 100.0, str(tmp_path), None, None, 4)
    assert result.loss_png == str(tmp_path / "loss.png") and (tmp_path / "loss.png").stat().st_size > 5000
    assert result.eval_losses == ((2, 2.5), (4, 1.0))
    text = report(result, load_config(text="train: {steps: 4}\n"))
    lines = text.splitlines()
    assert lines[2] == f"eval loss     2.500 -> 1.000  (steps 2 and 4; perplexity {math.exp(1.0):.4g})"
    assert f"loss curve    {tmp_path / 'loss.png'}" in lines


def test_a_report_without_eval_has_no_eval_line():
    nan = float("nan")
    result = RunResult([2.0, 1.0], 10.0, nan, nan, None, None, None, None, 2)
    assert not any(line.startswith("eval loss") for line in report(result, load_config(text="")).splitlines())
