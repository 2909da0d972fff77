"""How ``bubbleless train`` ends on an error found after startup: a ``ValueError`` (the user's input is wrong,
the message says what to change) gives one line ``bubbleless: <message>`` and exit code 2, whether it was
raised in this process (the pool, one rank) or in spawned ranks (printed once, not per rank); any other
error keeps its traceback and exit code 1, and a rank that died keeps its one-line headline."""

import os
import subprocess
import sys

import pytest

from bubbleless_runtime import _testing as testing
from bubbleless_runtime import cli
from bubbleless_runtime.launch import RankFailure

TINY_MODEL = """\
model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}
"""
STAGES = TINY_MODEL + "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 2}\ntrain: {steps: 2}\n"
HF_TINY = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def model_dir(tmp_path) -> str:
    """A tiny Hugging Face model directory with a tokenizer (``data.path`` needs one)."""
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(__file__))  # _data_fixtures, beside this file
    from _data_fixtures import tiny_tokenizer

    from bubbleless_runtime.models import build_causal_lm

    path = tmp_path / "model"
    build_causal_lm("llama", seed=0, **HF_TINY).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def spawned_run(tmp_path, text: str):
    return testing.run_cli(["train", write(tmp_path, text), "--output-dir", str(tmp_path / "out")])


def test_a_pool_plan_over_the_memory_budget_is_one_line_and_exit_2(tmp_path, capsys):
    """Found when the pool is built (``run_pool``, in this process), after the config checks."""
    path = write(tmp_path, TINY_MODEL + "pipeline: {schedule: roundrobin, devices: [cpu, cpu], memory_budget: 1000}\n"
                                        "train: {steps: 2}\n")
    assert cli.main(["train", path, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bubbleless: the round-robin plan does not fit memory_budget=1000 B per device"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_value_error_in_this_process_ends_a_torchrun_rank_with_code_2(tmp_path, capsys, monkeypatch):
    """Under torchrun the rank leaves through ``_end_rank_process`` (os._exit) with code 2, as a stop does."""

    def run_rank(config):
        raise ValueError("data.path 'x.jsonl': the file holds no records")

    def end(code=0):
        raise SystemExit(code)

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(cli, "run_rank", run_rank)
    monkeypatch.setattr(cli, "_end_rank_process", end)
    with pytest.raises(SystemExit) as ended:
        cli.main(["train", write(tmp_path, STAGES), "--output-dir", str(tmp_path / "out")])
    assert ended.value.code == 2
    assert capsys.readouterr().err == "bubbleless: data.path 'x.jsonl': the file holds no records\n"


def test_a_rank_that_died_keeps_its_headline_and_exit_1(tmp_path, capsys, monkeypatch):
    def launch(config):
        raise RankFailure("rank 1 was killed by SIGKILL without reporting a result (of 2 ranks)")

    monkeypatch.setattr(cli, "launch", launch)
    assert cli.main(["train", write(tmp_path, STAGES), "--output-dir", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == "bubbleless: rank 1 was killed by SIGKILL without reporting a result (of 2 ranks)\n"


def test_another_error_in_this_process_keeps_its_traceback_and_exit_1(tmp_path):
    path = write(tmp_path, TINY_MODEL + "pipeline: {schedule: roundrobin, devices: [cpu, cpu]}\ntrain: {steps: 2}\n")
    # testing.run_cli starts main itself: here run_pool is replaced first, in the same interpreter
    code = ("from bubbleless_runtime import cli\n"
            "def run_pool(config): raise RuntimeError('a bug, not the input')\n"
            "cli.run_pool = run_pool\n"
            f"raise SystemExit(cli.main(['train', {path!r}, '--output-dir', {str(tmp_path / 'out')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" in done.stderr and done.stderr.strip().endswith("RuntimeError: a bug, not the input")
    assert "bubbleless:" not in done.stderr


@pytest.mark.slow
def test_an_empty_data_file_found_by_spawned_ranks_is_one_line_and_exit_2(tmp_path):
    """Each rank reads ``data.path`` and raises; the launcher prints the root cause's message once."""
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    done = spawned_run(tmp_path, f"model: {{path: {model_dir(tmp_path)}}}\n"
                                 f"data: {{path: {data}, seq_len: 64, batch_size: 4}}\n"
                                 "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 2}\ntrain: {steps: 2}\n")
    assert done.returncode == 2, done.stderr[-3000:]
    message = f"bubbleless: {data}: the file holds no records; remove it or add samples"
    assert [line for line in done.stderr.splitlines() if "bubbleless:" in line] == [message], done.stderr[-3000:]
    assert done.stderr.count("the file holds no records") == 1 and "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_another_error_in_spawned_ranks_keeps_its_traceback_and_exit_1(tmp_path):
    """Unreadable weights: safetensors raises its own error type in every rank, not a ValueError."""
    model = model_dir(tmp_path)
    with open(os.path.join(model, "model.safetensors"), "w") as handle:
        handle.write("not weights")
    done = spawned_run(tmp_path, f"model: {{path: {model}}}\n"
                                 "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 2}\ntrain: {steps: 2}\n")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" in done.stderr and "SafetensorError" in done.stderr, done.stderr[-3000:]
    assert "bubbleless:" not in done.stderr
