"""Checkpoints: complete or absent (never half-written), nothing unpickled, one clear error per bad file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from bubbleless_runtime import checkpoint_files as files
from bubbleless_runtime import cli
from bubbleless_runtime._testing.trainers import TinyBatches, tiny_trainer
from bubbleless_runtime.checkpoint import load, manifest_of
from bubbleless_runtime.checkpoint_state import join, read, split
from bubbleless_runtime.trainer import Trainer


def trained(steps: int) -> Trainer:
    trainer = tiny_trainer()
    for _ in range(steps):
        trainer.train_step(TinyBatches())
    return trainer


def test_rt_checkpoint_is_a_manifest_safetensors_and_json_and_a_latest_pointer(tmp_path):
    path = trained(2).save(tmp_path / "checkpoint-2")
    assert sorted(os.listdir(path)) == ["manifest.json", "rank00000.json", "rank00000.safetensors"]
    manifest = manifest_of(path)
    assert manifest["step"] == 2 and manifest["world_size"] == 1 and manifest["format"] == "bubbleless-checkpoint"
    assert set(manifest["files"]) == {"rank00000.json", "rank00000.safetensors"}
    assert all(len(r["sha256"]) == 64 and r["size"] > 0 for r in manifest["files"].values())
    assert "torch" in manifest["versions"] and "bubbleless-runtime" in manifest["versions"]
    assert (tmp_path / "latest").read_text() == "checkpoint-2\n"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_rt_resume_from_the_new_files_is_exact(tmp_path):
    whole = trained(2)
    path = whole.save(tmp_path / "checkpoint-2")
    want = [whole.train_step(TinyBatches()).loss for _ in range(2)]
    resumed = tiny_trainer(seed=5)
    resumed.load(path)
    assert [resumed.train_step(TinyBatches()).loss for _ in range(2)] == want


def test_rt_state_round_trips_tuples_int_keys_and_refuses_objects():
    state = {"a": (1, 2.5, None), "opt": {0: {"m": torch.ones(2)}, 1: {"m": torch.zeros(1)}}, "s": "x"}
    tree, tensors = split(state)
    json.dumps(tree)  # plain JSON
    back = join(json.loads(json.dumps(tree)), tensors, source="test")
    assert back["a"] == (1, 2.5, None) and back["s"] == "x" and torch.equal(back["opt"][0]["m"], torch.ones(2))
    with pytest.raises(TypeError, match="at opt.f is a function"):
        split({"opt": {"f": lambda: 0}})


def test_rt_a_write_cut_short_is_never_a_checkpoint_and_resume_names_the_newest_complete_one(tmp_path, monkeypatch):
    trainer = trained(1)
    good = trainer.save(tmp_path / "checkpoint-1")
    trainer.train_step(TinyBatches())

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the manifest")

    monkeypatch.setattr(files, "publish", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save(tmp_path / "checkpoint-2")
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint-2").exists() and (tmp_path / ".checkpoint-2.partial").is_dir()
    os.makedirs(tmp_path / "checkpoint-3")  # a half-copied or foreign directory under a checkpoint's name
    (tmp_path / "checkpoint-3" / "rank00000.safetensors").write_bytes(b"\0" * 10)
    assert files.resolve("latest", str(tmp_path)) == good
    with pytest.raises(ValueError, match=r"checkpoint-3 is incomplete: it has no manifest.json, so its writing was "
                                         r"cut short .*the newest complete checkpoint there is .*checkpoint-1"):
        files.resolve(str(tmp_path / "checkpoint-3"), str(tmp_path))
    trainer.save(tmp_path / "checkpoint-2")  # the next write clears what the killed one left
    assert not (tmp_path / ".checkpoint-2.partial").exists()
    assert files.resolve("latest", str(tmp_path)).endswith("checkpoint-2")


def test_rt_keep_checkpoints_keeps_the_newest_complete_ones(tmp_path):
    trainer = tiny_trainer()
    for _ in range(4):
        trainer.train_step(TinyBatches())
        trainer.save(tmp_path / f"checkpoint-{trainer.step}", keep=2)
    os.makedirs(tmp_path / "notes")  # never touched: not a checkpoint name
    os.makedirs(tmp_path / "checkpoint-9")  # newer but incomplete (no manifest): neither counted nor removed
    os.makedirs(tmp_path / ".checkpoint-7.partial")  # what a killed write leaves: removed
    trainer.train_step(TinyBatches())
    trainer.save(tmp_path / f"checkpoint-{trainer.step}", keep=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-4", "checkpoint-5", "checkpoint-9", "latest", "notes"]


def _saved(tmp_path) -> str:
    return trained(1).save(tmp_path / "checkpoint-1")


def test_rt_a_corrupt_file_is_named(tmp_path):
    path = _saved(tmp_path)
    tensors = os.path.join(path, "rank00000.safetensors")
    data = bytearray(open(tensors, "rb").read())
    data[-3] ^= 0xFF  # same size, other bytes
    open(tensors, "wb").write(bytes(data))
    with pytest.raises(ValueError, match=r"rank00000.safetensors: checksum or size differs from its manifest"):
        load(path)


def test_rt_a_truncated_file_is_named(tmp_path):
    path = _saved(tmp_path)
    meta = os.path.join(path, "rank00000.json")
    os.truncate(meta, 10)
    with pytest.raises(ValueError, match=r"rank00000.json: 10 bytes, its manifest says \d+: the file is truncated"):
        load(path)


def test_rt_foreign_files_are_named(tmp_path):
    path = _saved(tmp_path)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    (tmp_path / "junk.json").write_text("{ truncated")
    with pytest.raises(ValueError, match=r"junk.safetensors: not a readable safetensors file"):
        read(str(tmp_path / "junk.safetensors"), str(tmp_path / "junk.json"))
    with pytest.raises(ValueError, match=r"junk.json: not valid JSON"):
        read(os.path.join(path, "rank00000.safetensors"), str(tmp_path / "junk.json"))
    (tmp_path / "checkpoint-1" / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match=r"manifest.json: not a bubbleless checkpoint manifest"):
        load(path)


def test_rt_another_rank_count_says_which_to_resume_with(tmp_path):
    path = _saved(tmp_path)
    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    manifest["world_size"] = 4
    open(os.path.join(path, "manifest.json"), "w").write(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"was written by 4 ranks but this run has 1: .*pipeline.nproc: 4"):
        load(path)


def test_rt_cli_refuses_an_incomplete_resume_before_starting_naming_the_newest_complete_one(tmp_path, capsys):
    _saved(tmp_path)
    os.makedirs(tmp_path / "checkpoint-7")
    code = cli.main(["train", "--output-dir", str(tmp_path), "--resume", str(tmp_path / "checkpoint-7")])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint-7 is incomplete" in err and "checkpoint-1: resume from it" in err, err
    code = cli.main(["train", "--output-dir", str(tmp_path / "empty"), "--resume", "latest"])
    assert code == 2 and "holds no complete checkpoint" in capsys.readouterr().err


SAVER = """
    import sys, torch
    from bubbleless_runtime._testing import SequentialPipeline, tiny_batch, tiny_loss, tiny_model
    from bubbleless_runtime.trainer import ScaledLoss, Trainer
    model = tiny_model(3, width=256)  # big enough that a write takes a while
    loss = ScaledLoss(tiny_loss)
    pipe = SequentialPipeline(list(model), loss, 2)
    trainer = Trainer(pipeline=pipe, layers=list(model), loss=loss, num_microbatches=2,
                      optimizer=torch.optim.AdamW(pipe.parameters(), lr=1e-2))
    step = 0
    while True:
        step += 1
        trainer.save(f"{sys.argv[1]}/checkpoint-{step}", keep=3)
        print(step, flush=True)
    """


@pytest.mark.slow
def test_rt_sigkill_during_writes_never_leaves_a_half_checkpoint(tmp_path):
    """A process saving in a loop is SIGKILLed at five moments; every ``checkpoint-N`` left is complete and
    loads, and ``latest`` resolves to one."""
    for attempt in range(5):
        out = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SAVER), str(out)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for _ in range(2 + attempt):  # let it finish a few writes, then kill it inside a later one
            proc.stdout.readline()
        time.sleep(0.01 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        names = [n for n in os.listdir(out) if n.startswith("checkpoint-")]
        assert names
        for name in names:
            load(out / name)  # complete, checksums verified
        assert files.resolve("latest", str(out)).endswith(max(names, key=lambda n: int(n.split("-")[1])))
        assert (out / files.LATEST).read_text().strip() in names  # the pointer never names a missing one
