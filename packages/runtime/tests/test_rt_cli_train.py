"""``bubbleless train`` end to end: real gloo ranks, the report, the pictures, checkpoints, LoRA on MoE."""

import math
import os

import pytest

from bubbleless_runtime import _testing as testing
from bubbleless_runtime.config import load_config
from bubbleless_runtime.report import RunResult, report


def run_cli(tmp_path, yaml_text, *extra, torchrun_nproc=None):
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    args = ["train", str(config), "--output-dir", str(tmp_path / "out"), *extra]
    done = testing.run_cli(args, torchrun_nproc=torchrun_nproc)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


TINY_MODEL = """\
model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}
"""


@pytest.mark.slow
def test_train_reports_loss_bubbles_and_writes_png_trace_and_checkpoint(tmp_path):
    out = run_cli(
        tmp_path,
        TINY_MODEL + "pipeline: {schedule: zbv, nproc: 2, num_microbatches: 4}\n"
        "train: {steps: 12, checkpoint: true, log_every: 2}\noptimizer: {lr: 1.0e-2, warmup_steps: 2}\n",
    )
    assert "schedule zbv, 2 ranks, 4 micro-batches, 12 steps" in out
    loss_line = next(line for line in out.splitlines() if line.startswith("loss"))
    first, last = (float(x) for x in loss_line.split()[1:4:2])
    assert last < first
    assert "bubble rate   measured" in out and "simulator" in out
    assert (tmp_path / "out" / "timeline.png").stat().st_size > 1000
    assert (tmp_path / "out" / "timeline.trace.json").stat().st_size > 100
    assert sorted(os.listdir(tmp_path / "out" / "checkpoint-12")) == [
        "manifest.json", "rank00000.json", "rank00000.safetensors", "rank00001.json", "rank00001.safetensors"
    ]
    assert (tmp_path / "out" / "latest").read_text() == "checkpoint-12\n"


@pytest.mark.slow
def test_lora_on_moe_trains_through_the_pipeline_and_saves_a_loadable_adapter(tmp_path):
    from peft import PeftModel

    from bubbleless_runtime.models import build_causal_lm

    out = run_cli(
        tmp_path,
        "model: {architecture: qwen3_moe, vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2,\n"
        "        num_heads: 4, num_kv_heads: 2, head_dim: 8, num_experts: 4, moe_intermediate_size: 16,\n"
        "        aux_loss_coef: 0.01}\n"
        "data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}\n"
        "lora: {enabled: true, rank: 4, target_modules: [q_proj, v_proj]}\n"
        "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 4}\ntrain: {steps: 4}\n",
    )
    adapter = tmp_path / "out" / "lora-adapter"
    assert f"LoRA adapter  {adapter}" in out
    base = build_causal_lm(
        "qwen3_moe", seed=0, vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, moe_intermediate_size=16,
    )  # fmt: skip
    loaded = PeftModel.from_pretrained(base, adapter)
    trained = [p for n, p in loaded.named_parameters() if "lora_B" in n]
    assert trained and all(
        p.abs().sum() > 0 for p in trained
    )  # lora_B starts at zero: every rank's got trained


@pytest.mark.slow
def test_torchrun_runs_the_module_as_a_program(tmp_path):
    """``torchrun -m bubbleless_runtime.cli train`` must train (the module needs its ``__main__`` guard)."""
    out = run_cli(
        tmp_path, TINY_MODEL + "pipeline: {schedule: 1f1b, num_microbatches: 4}\n", "--steps", "2", torchrun_nproc=2
    )
    assert "schedule 1f1b, 2 ranks, 4 micro-batches, 2 steps" in out
    loss_line = next(line for line in out.splitlines() if line.startswith("loss"))
    assert all(math.isfinite(float(x)) for x in loss_line.split()[1:4:2])


@pytest.mark.slow
def test_resuming_a_finished_run_says_there_is_nothing_to_do(tmp_path):
    yaml_text = TINY_MODEL + "pipeline: {schedule: 1f1b, nproc: 1, num_microbatches: 2}\ntrain: {steps: 2, checkpoint: true}\n"
    run_cli(tmp_path, yaml_text)
    out = run_cli(tmp_path, yaml_text, "--resume", str(tmp_path / "out" / "checkpoint-2"))
    assert "nothing to do: the checkpoint is at step 2 of 2" in out
    assert not any(line.startswith("loss") for line in out.splitlines())


def test_report_without_steps_says_where_the_checkpoint_is():
    nan = float("nan")
    config = load_config(text=TINY_MODEL + "train: {steps: 5}\n")
    text = report(RunResult([], nan, nan, nan, None, None, None, None, 7), config)
    assert text.startswith("nothing to do: the checkpoint is at step 7 of 5")


@pytest.mark.slow
def test_the_embedded_default_runs_as_shipped(tmp_path):
    """``bubbleless train`` with no config (README's first command), cut to 12 steps: 4 ranks, zbv, the
    auto partition and its report, the loss falling."""
    done = testing.run_cli(["train", "--steps", "12", "--output-dir", str(tmp_path / "out")])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "schedule zbv, 4 ranks, 8 micro-batches, 12 steps" in out, out
    loss_line = next(line for line in out.splitlines() if line.startswith("loss"))
    first, last = (float(x) for x in loss_line.split()[1:4:2])
    assert last < first
    assert "auto cut" in out and "even cut" in out
    assert (tmp_path / "out" / "timeline.png").stat().st_size > 1000
