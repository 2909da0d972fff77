"""``--resume latest`` and pruning go by when checkpoints were written, not their steps, a run
writing beside an earlier run's later checkpoints is warned, and ``--resume <run directory>`` resumes its
latest checkpoint."""

from __future__ import annotations

import os
import warnings

import pytest

from bubbleless_runtime import checkpoint_files as files
from bubbleless_runtime._testing.trainers import TinyBatches, tiny_trainer
from bubbleless_runtime.config import load_config
from bubbleless_runtime.train_pipelines import check_reliability


def _run(out, steps: int, *, save_every: int, keep: int = 0, seed: int = 0) -> None:
    """A run of ``steps`` steps saving every ``save_every`` into ``out``, as ``train_loop`` does."""
    trainer = tiny_trainer(seed=seed)
    for _ in range(steps):
        trainer.train_step(TinyBatches())
        if trainer.step % save_every == 0:
            trainer.save(out / f"checkpoint-{trainer.step}", keep=keep)


def _listing(out) -> list[str]:
    return sorted(os.listdir(out))


def test_rt_resume_latest_follows_the_latest_file_and_keep_prunes_by_write_time(tmp_path):
    _run(tmp_path, 10, save_every=2, keep=2)  # an earlier, longer run: checkpoint-8 and checkpoint-10
    assert _listing(tmp_path) == ["checkpoint-10", "checkpoint-8", "latest"]
    _run(tmp_path, 6, save_every=2, keep=2, seed=1)  # a new run into the same directory
    assert _listing(tmp_path) == ["checkpoint-4", "checkpoint-6", "latest"]
    assert (tmp_path / "latest").read_text() == "checkpoint-6\n"
    assert files.resolve("latest", str(tmp_path)) == str(tmp_path / "checkpoint-6")


def test_rt_resume_latest_without_pruning_is_the_one_written_last_not_the_highest_step(tmp_path):
    _run(tmp_path, 10, save_every=5)
    _run(tmp_path, 4, save_every=2, seed=1)
    assert _listing(tmp_path) == ["checkpoint-10", "checkpoint-2", "checkpoint-4", "checkpoint-5", "latest"]
    assert files.resolve("latest", str(tmp_path)) == str(tmp_path / "checkpoint-4")
    # the one written last is gone (or cut short): the complete one written before it
    os.rename(tmp_path / "checkpoint-4", tmp_path / ".checkpoint-4.deleting")
    assert files.resolve("latest", str(tmp_path)) == str(tmp_path / "checkpoint-2")


def test_rt_resume_latest_takes_a_checkpoint_published_before_a_kill_left_the_latest_file_behind(tmp_path):
    _run(tmp_path, 9, save_every=1)
    (tmp_path / "latest").write_text("checkpoint-8\n")  # killed after checkpoint-9's rename, before the pointer
    assert files.resolve("latest", str(tmp_path)) == str(tmp_path / "checkpoint-9")


def test_rt_resume_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    _run(tmp_path, 10, save_every=5)
    _run(tmp_path, 2, save_every=2, keep=1, seed=1)
    assert _listing(tmp_path) == ["checkpoint-2", "latest"]


def _config(out, extra: str = ""):
    return load_config(text=f"train: {{output_dir: {out}, save_every: 2, keep_checkpoints: 2{extra}}}\n")


def test_rt_resume_writing_beside_later_checkpoints_warns_once(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    _run(tmp_path, 10, save_every=5)
    with pytest.warns(UserWarning, match=r"already holds checkpoint-5, checkpoint-10, of later steps than this run "
                                         r"starts from \(step 0\).*--resume latest takes the checkpoint written last") as caught:
        check_reliability(_config(tmp_path))
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_reliability(_config(tmp_path, ", resume: latest"))  # continues checkpoint-10: nothing later
        check_reliability(_config(tmp_path / "fresh"))
        check_reliability(load_config(text=f"train: {{output_dir: {tmp_path}}}\n"))  # writes no checkpoint
        monkeypatch.setenv("RANK", "1")  # under torchrun: rank 0 alone says it
        check_reliability(_config(tmp_path))


def test_rt_resume_a_run_directory_resumes_its_latest_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    run = tmp_path / "run"
    _run(run, 10, save_every=5)
    _run(run, 4, save_every=2, seed=1)
    assert files.resolve(str(run), str(tmp_path / "elsewhere")) == str(run / "checkpoint-4")
    config = _config(tmp_path / "next", f", resume: {run}")
    check_reliability(config)
    assert config.train.resume == str(run / "checkpoint-4")
    assert f"resume: {run} is {run / 'checkpoint-4'}" in capsys.readouterr().out
    empty = tmp_path / "empty"
    os.makedirs(empty / "checkpoint-3")  # cut short: no manifest
    with pytest.raises(ValueError, match=r"empty is a run's output directory, not a checkpoint, and it holds no "
                                         r"complete checkpoint"):
        files.resolve(str(empty), str(tmp_path))
    incomplete = run / "checkpoint-7"
    os.makedirs(incomplete)  # a checkpoint directory cut short is still named as one
    with pytest.raises(ValueError, match=r"checkpoint-7 is incomplete.*newest complete checkpoint there is "
                                         r".*checkpoint-4: resume from it"):
        files.resolve(str(incomplete), str(tmp_path))


TINY = """\
model: {vocab_size: 16, hidden_size: 16, intermediate_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 4}
pipeline: {schedule: 1f1b, nproc: 1, num_microbatches: 2}
train: {save_every: 2, keep_checkpoints: 2}
"""


@pytest.mark.slow
def test_rt_resume_the_reviewers_repro_through_bubbleless_train(tmp_path):
    """An earlier 10-step run's checkpoints, a 6-step run into the same directory, then ``--resume <it>``."""
    from bubbleless_runtime import _testing as testing

    config = tmp_path / "run.yaml"
    config.write_text(TINY)
    out = tmp_path / "out"

    def train(*args):
        done = testing.run_cli(["train", str(config), "--output-dir", str(out), *args])
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done

    assert "UserWarning" not in train("--steps", "10").stderr
    assert [n for n in _listing(out) if n.startswith("checkpoint")] == ["checkpoint-10", "checkpoint-8"]
    again = train("--steps", "6")
    assert again.stderr.count("already holds checkpoint-8, checkpoint-10") == 1, again.stderr
    assert [n for n in _listing(out) if n.startswith("checkpoint")] == ["checkpoint-4", "checkpoint-6"]
    assert (out / "latest").read_text() == "checkpoint-6\n"
    resumed = train("--steps", "8", "--resume", str(out))
    assert f"resume: {out} is {out / 'checkpoint-6'}" in resumed.stdout, resumed.stdout
    assert "UserWarning" not in resumed.stderr
    assert [n for n in _listing(out) if n.startswith("checkpoint")] == ["checkpoint-6", "checkpoint-8"]
