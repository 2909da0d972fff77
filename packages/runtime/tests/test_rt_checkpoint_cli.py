"""``bubbleless train`` checkpoints end to end: an auto cut resumes exactly, SIGTERM saves and resumes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from bubbleless_runtime._testing.train_runs import sigterm_after_first_checkpoint
from bubbleless_runtime.checkpoint import manifest_of
from bubbleless_runtime.metrics import read_metrics

TINY = """\
model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}
optimizer: {lr: 1.0e-2, warmup_steps: 2}
"""


def train(tmp_path, yaml_text: str, out: str, *extra) -> subprocess.CompletedProcess:
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    command = [sys.executable, "-c", "from bubbleless_runtime.cli import main; raise SystemExit(main())", "train",
               str(config), "--output-dir", str(tmp_path / out), *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def same_files(a, b, world: int) -> bool:
    """Bit-identical training state (every tensor and number) in two checkpoints, rank by rank."""
    for rank in range(world):
        x, y = _load_as(a, rank), _load_as(b, rank)
        if x["step"] != y["step"] or x["data_position"] != y["data_position"] or x["partition"] != y["partition"]:
            return False
        if not all(torch.equal(p, q) for p, q in zip(x["params"], y["params"], strict=True)):
            return False
        for s, t in zip(x["optimizer"]["state"].values(), y["optimizer"]["state"].values(), strict=True):
            if not all(torch.equal(s[k], t[k]) for k in s):
                return False
    return True


def _load_as(directory, rank: int) -> dict:
    from bubbleless_runtime import checkpoint_files as files
    from bubbleless_runtime.checkpoint_state import read

    manifest = manifest_of(directory)
    name = f"rank{rank:05d}"
    return read(files.verify_file(str(directory), name + ".safetensors", manifest),
                files.verify_file(str(directory), name + ".json", manifest))


@pytest.mark.slow
def test_rt_an_auto_cut_resumes_with_its_own_cut_and_schedule_bit_exactly(tmp_path):
    """partition: auto profiles (timing noise may cut elsewhere on every start); a resume takes the
    checkpoint's cut and schedule instead and reproduces the uninterrupted run exactly."""
    yaml_text = TINY + "pipeline: {schedule: zbv, nproc: 2, num_microbatches: 4, partition: auto}\n" \
                       "train: {steps: 6, save_every: 3}\n"
    whole = train(tmp_path, yaml_text, "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut = manifest_of(tmp_path / "whole" / "checkpoint-3")["partition"]
    resumed = train(tmp_path, yaml_text, "resumed", "--resume", str(tmp_path / "whole" / "checkpoint-3"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resume: partition auto takes the checkpoint's cut {cut}" in resumed.stdout
    # it resumed, not retrained: a run from scratch writes the same checkpoint-6 (the config's seed)
    assert "4 micro-batches, 3 steps" in resumed.stdout
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")] == [4, 5, 6]
    assert manifest_of(tmp_path / "resumed" / "checkpoint-6")["schedule"] == \
        manifest_of(tmp_path / "whole" / "checkpoint-6")["schedule"]
    assert same_files(tmp_path / "whole" / "checkpoint-6", tmp_path / "resumed" / "checkpoint-6", 2)


@pytest.mark.slow
def test_rt_sigterm_saves_a_checkpoint_exits_143_and_resume_latest_finishes(tmp_path):
    yaml_text = TINY + "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 2}\n" \
                       "train: {steps: 400, save_every: 2, checkpoint: true, keep_checkpoints: 1}\n"
    stopped_at, out, err = sigterm_after_first_checkpoint(tmp_path, yaml_text)
    assert manifest_of(out / f"checkpoint-{stopped_at}")["step"] == stopped_at
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == [f"checkpoint-{stopped_at}"]
    finished = train(tmp_path, yaml_text.replace("steps: 400", f"steps: {stopped_at + 2}"), "out", "--resume", "latest")
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "2 micro-batches, 2 steps" in finished.stdout  # resumed: a run from scratch would train them all
    assert _load_as(out / f"checkpoint-{stopped_at + 2}", 1)["step"] == stopped_at + 2
