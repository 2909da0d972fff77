"""Bad input, everywhere (issue 9, section 3): one table per entry point, each case asserting the message
names the key (or file, or argument) and says what to change.

Config cases go through ``load_config`` / ``validate`` (no process); the checks that need the model or
the machine through ``config_runtime.check_before_run``; a few through the real ``bubbleless train``
entry point, which must exit 2 with one message before anything is spawned.
"""

from __future__ import annotations

import json
import os

import pytest

from bubbleless_partition import LayerCost
from bubbleless_runtime import cli
from bubbleless_runtime.config import load_config
from bubbleless_runtime.config_checks import check_schedule
from bubbleless_runtime.config_runtime import check_before_run
from bubbleless_schedules import Costs, Schedule, generate, simulate

# (YAML text, regex the ValueError must match); "{tmp}" is the test's temporary directory
CONFIG_CASES = [
    # ranges of the training loop and the optimizer
    ("train: {log_every: 0}", r"train\.log_every must be at least 1"),
    ("optimizer: {betas: [0.9]}", r"optimizer\.betas must be two numbers in \[0, 1\).*got \[0\.9\]; e\.g\. \[0\.9, 0\.95\]"),
    ("optimizer: {betas: [0.9, 1.0]}", r"optimizer\.betas must be two numbers in \[0, 1\)"),
    ("optimizer: {betas: [-0.1, 0.9]}", r"optimizer\.betas must be two numbers in \[0, 1\)"),
    ("optimizer: {betas: [0.9, 0.95, 0.99]}", r"optimizer\.betas must be two numbers"),
    ("optimizer: {max_grad_norm: -1}", r"optimizer\.max_grad_norm must be a finite number > 0 \(or 0 / null: no clipping\)"),
    ("optimizer: {max_grad_norm: .nan}", r"optimizer\.max_grad_norm must be a finite number > 0"),
    ("optimizer: {warmup_steps: -4}", r"optimizer\.warmup_steps must be 0 \(no warmup\) or more, got -4"),
    ("train: {save_every: -5}", r"train\.save_every must be a positive step count, or 0 / null .* got -5"),
    ("optimizer: {lr: -1.0e-3}", r"optimizer\.lr must be a finite number > 0, got -0\.001 \(e\.g\. 3\.0e-3\)"),
    ("optimizer: {lr: .nan}", r"optimizer\.lr must be a finite number > 0, got nan"),
    ("optimizer: {lr: .inf}", r"optimizer\.lr must be a finite number > 0, got inf"),
    ("optimizer: {lr: 0}", r"optimizer\.lr must be a finite number > 0"),
    ("optimizer: {eps: 0}", r"optimizer\.eps must be a finite number > 0"),
    ("optimizer: {weight_decay: -0.1}", r"optimizer\.weight_decay must be a finite number >= 0"),
    ("optimizer: {momentum: 1.0}", r"optimizer\.momentum must be in \[0, 1\)"),
    ("optimizer: {min_lr_ratio: 1.5}", r"optimizer\.min_lr_ratio is a fraction of optimizer\.lr in \[0, 1\]"),
    ("train: {output_dir: ''}", r"train\.output_dir is empty; name a directory"),
    # the model's sizes
    ("model: {hidden_size: 0}", r"model\.hidden_size must be at least 1, got 0"),
    ("model: {intermediate_size: -1}", r"model\.intermediate_size must be at least 1, got -1"),
    ("model: {num_heads: 0}", r"model\.num_heads must be at least 1"),
    ("model: {num_kv_heads: 0}", r"model\.num_kv_heads must be at least 1"),
    ("model: {head_dim: 0}", r"model\.head_dim must be at least 1"),
    ("model: {vocab_size: 0}", r"model\.vocab_size must be at least 1"),
    ("model: {max_position_embeddings: 0}", r"model\.max_position_embeddings must be at least 1"),
    ("model: {num_heads: 4, num_kv_heads: 3}",
     r"model\.num_kv_heads 3 does not divide model\.num_heads 4: .* pick a divisor of 4, e\.g\. \[1, 2, 4\]"),
    ("model: {architecture: llama, hidden_size: 64, num_heads: 6, num_kv_heads: 2}",
     r"model\.num_heads 6 does not divide model\.hidden_size 64 \(llama derives the head width.*pick num_heads from"),
    ("model: {architecture: qwen2, hidden_size: 64, num_heads: 6, num_kv_heads: 3}",
     r"model\.num_heads 6 does not divide model\.hidden_size 64 \(qwen2"),
    ("model: {architecture: qwen3_moe, num_experts: 4, experts_per_token: 5}",
     r"model\.experts_per_token 5 is more than model\.num_experts 4; route each token to at most 4"),
    ("model: {architecture: qwen3_moe, num_experts: 0}", r"model\.num_experts must be at least 1"),
    ("model: {aux_loss_coef: -1}", r"model\.aux_loss_coef must be a finite number >= 0"),
    # the data against the model
    ("data: {length: 200}",
     r"the synthetic samples \(2 \* data\.length \+ 2 = 402 tokens\) are longer than model\.max_position_embeddings "
     r"256; raise model\.max_position_embeddings, or lower data\.length"),
    ("model: {vocab_size: 8}", r"model\.vocab_size 8 is too small for data\.num_symbols 16; make it at least 19"),
    # LoRA
    ("lora: {enabled: true, rank: 0}", r"lora\.rank must be at least 1, got 0 \(turn LoRA off with lora\.enabled: false\)"),
    ("lora: {enabled: true, alpha: 0}", r"lora\.alpha must be a finite number > 0"),
    ("lora: {enabled: true, dropout: 1.0}", r"lora\.dropout is a probability in \[0, 1\)"),
    ("lora: {enabled: true, target_modules: []}", r"lora\.target_modules is empty; name the linear layers"),
    # model.path, read without torch (its config.json)
    ("model: {path: /nonexistent/model}",
     r"model\.path '/nonexistent/model' does not exist; point it at a local Hugging Face model directory"),
    ("model: {path: '{tmp}/afile'}", r"model\.path '.*afile' is a file; point it at the directory that holds config.json"),
    ("model: {path: '{tmp}/empty'}", r"model\.path '.*empty' has no config\.json, so it is not a Hugging Face model"),
    ("model: {path: '{tmp}/badjson'}", r"model\.path '.*badjson': config\.json cannot be read as JSON"),
    ("model: {path: '{tmp}/smallvocab'}",
     r"data\.num_symbols 16 needs token ids up to 18 but the model at model\.path has vocab_size 10 .*at most 7"),
    ("model: {path: '{tmp}/shortpos'}",
     r"are longer than max_position_embeddings in .*shortpos/config\.json 16; use shorter sequences"),
    # pipeline
    ("pipeline: {schedule: '{tmp}/missing.csv'}", r"pipeline\.schedule '.*missing\.csv' is a path but no such file"),
    ("pipeline: {schedule: '{tmp}/deadlock.csv'}", r"pipeline\.schedule '.*deadlock\.csv': .*deadlock"),
    ("pipeline: {schedule: '{tmp}/incomplete.csv'}", r"pipeline\.schedule '.*incomplete\.csv': .*incomplete schedule"),
    ("pipeline: {memory_cap: 1.0e9}", r"pipeline\.memory_cap applies to pipeline\.partition: auto only"),
    ("pipeline: {partition: auto, memory_cap: -5}", r"pipeline\.memory_cap must be a positive number of bytes"),
]


@pytest.fixture
def files(tmp_path):
    """The model directories and CSV schedules the table's cases point at."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{not json")
    for name, fields in (("smallvocab", {"vocab_size": 10}), ("shortpos", {"max_position_embeddings": 16})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen3", **fields}))
    good = generate("1f1b", num_ranks=2, num_microbatches=8)
    rows = [list(r) for r in good.actions]
    deadlock = good.replace(actions=tuple(tuple(r) for r in [list(reversed(rows[0])), rows[1]]))
    (tmp_path / "deadlock.csv").write_text(deadlock.to_csv())
    (tmp_path / "incomplete.csv").write_text(good.replace(actions=(tuple(rows[0][:-1]), tuple(rows[1]))).to_csv())
    good.to_csv(tmp_path / "good.csv")
    return tmp_path


@pytest.mark.parametrize(("text", "match"), CONFIG_CASES, ids=[c[0][:60] for c in CONFIG_CASES])
def test_a_bad_config_value_is_refused_on_load_naming_the_key(files, text, match):
    with pytest.raises(ValueError, match=match):
        load_config(text=text.replace("{tmp}", str(files)) + "\n")


# (file text, regex): what load_config(path) says about the file itself; {file} is its path
FILE_CASES = [
    ("train: {steps: 3\n", r"run\.yaml:2:1: invalid YAML \(while parsing a flow mapping\): expected ',' or '\}'.*fix the file"),
    ("train:\n  steps: 1\n lr: 2\n", r"run\.yaml:3:\d+: invalid YAML"),
    ("train:\n\tsteps: 1\n", r"run\.yaml:2:1: invalid YAML .*'\\t'"),
    ("optimizer: [1, 2\n", r"run\.yaml:2:1: invalid YAML \(while parsing a flow sequence\)"),
    ("train:\n  steps: 1\ntrain:\n  steps: 2\n",
     r"run\.yaml:3:1: key 'train' is given twice \(first on line 1\); the second would silently replace the first: "
     r"merge them into one"),
    ("train:\n  steps: 1\n  seed: 3\n  steps: 2\n", r"run\.yaml:4:3: key 'steps' is given twice \(first on line 2\)"),
    ("model: {num_layers: 2, num_layers: 3}\n", r"run\.yaml:1:24: key 'num_layers' is given twice"),
    ("", r"config file '.*run\.yaml' is empty: write the sections to change .*or run `bubbleless train` with no file for "
         r"the embedded demo"),
    ("# only a comment\n\n", r"config file '.*run\.yaml' is empty"),
]


@pytest.mark.parametrize(("text", "match"), FILE_CASES, ids=[repr(c[0][:30]) for c in FILE_CASES])
def test_a_bad_config_file_is_refused_naming_the_file_and_where(tmp_path, text, match):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_config(path)


def test_a_config_path_that_is_a_directory_or_missing(tmp_path):
    with pytest.raises(ValueError, match=r"config file '.*' is a directory; give the path of a YAML file"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match=r"config file '.*nope\.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_the_api_keeps_library_defaults_for_empty_text():
    """Only a file that is empty is refused (a user meant to write something); ``text=""`` is the API."""
    assert load_config(text="").train.steps == 200


# (YAML text, num_ranks, regex): checks before spawning that need the schedule, the machine or the model
RUN_CASES = [
    ("train: {output_dir: '{tmp}/afile/sub'}", 2, r"train\.output_dir '.*afile/sub' cannot be written \('.*afile' would hold "
                                                   r"it\): Not a directory; the report, trace and checkpoints go there"),
    ("train: {output_dir: '{tmp}/afile'}", 2, r"train\.output_dir '.*afile' is a file; name a directory"),
    ("lora: {enabled: true, target_modules: [q_proj, qkv]}", 2,
     r"lora\.target_modules \['qkv'\] match no linear layer of the model; its linear layers are named \[.*'k_proj'.*\]"),
    ("model: {path: '{tmp}/hf'}\nlora: {enabled: true, target_modules: [c_attn]}", 2,
     r"lora\.target_modules \['c_attn'\] match no linear layer"),
    ("pipeline: {schedule: 1f1b, partition: auto, memory_cap: 1000}", 2,
     r"pipeline\.memory_cap 1000 bytes cannot fit: the parameters alone need at least [\d,]+ bytes per stage .*raise "
     r"memory_cap above"),
    ("pipeline: {schedule: zbv, partition: auto, memory_cap: 1000, nproc: 2}", 2,
     r"pipeline\.memory_cap 1000 bytes cannot fit: .* per rank"),
    ("pipeline: {schedule: '{tmp}/good.csv', nproc: 4}", 4,
     r"pipeline\.schedule '.*good\.csv' is for 2 ranks but the run has 4; set pipeline\.nproc: 2"),
    ("pipeline: {schedule: '{tmp}/good.csv', nproc: 2, num_microbatches: 4}", 2,
     r"pipeline\.schedule '.*good\.csv' has 8 micro-batches but pipeline\.num_microbatches is 4; set "
     r"pipeline\.num_microbatches: 8"),
]


@pytest.mark.parametrize(("text", "ranks", "match"), RUN_CASES, ids=[c[0][:60] for c in RUN_CASES])
def test_a_config_that_cannot_run_here_is_refused_before_spawning(files, text, ranks, match):
    hf = files / "hf"
    if not hf.exists():
        hf.mkdir()
        (hf / "config.json").write_text(json.dumps({
            "model_type": "qwen3", "vocab_size": 32, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "max_position_embeddings": 64,
        }))
    config = load_config(text=text.replace("{tmp}", str(files)) + "\n")
    if "output_dir" not in text:
        config.train.output_dir = str(files / "out")
    with pytest.raises(ValueError, match=match):
        check_schedule(config, num_ranks=ranks)
        check_before_run(config, num_ranks=ranks)


# (call, regex): the schedules and partition APIs
API_CASES = [
    (lambda: Costs(forward=float("inf")), r"Costs\.forward must be finite non-negative numbers, got inf"),
    (lambda: Costs(1, 1, 1, comm=float("nan")), r"Costs\.comm must be finite non-negative numbers"),
    (lambda: Costs.parse("inf,1,1"), r"--costs 'inf,1,1': Costs\.forward must be finite.*give finite numbers"),
    (lambda: generate("zb", num_ranks=2, num_microbatches=4, memory_limit=float("nan")),
     r"memory_limit is in M_B and must be a positive number \(inf or None: no limit\), got nan"),
    (lambda: simulate(generate("1f1b", num_ranks=2, num_microbatches=2), (1, 1, 1)),
     r"costs must be a bubbleless_schedules\.Costs, got tuple .*pass Costs\(forward, backward_input"),
    (lambda: simulate(_incomplete()), r"incomplete schedule \(simulate needs every action; add the missing ones\)"),
    (lambda: Schedule.from_csv("missing.csv"), r"schedule CSV file 'missing\.csv' does not exist"),
    (lambda: LayerCost(name="embed", forward=float("inf"), input_grad=1, weight_grad=1),
     r"LayerCost\('embed'\)\.forward must be a finite non-negative number"),
    (lambda: LayerCost(name="head", forward=1, input_grad=1, weight_grad=1, param_bytes=float("nan")),
     r"LayerCost\('head'\)\.param_bytes must be a finite non-negative number"),
]


def _incomplete() -> Schedule:
    full = generate("1f1b", num_ranks=2, num_microbatches=2)
    return full.replace(actions=(full.actions[0][:-1], full.actions[1]))


@pytest.mark.parametrize(("call", "match"), API_CASES, ids=[c[1][:40] for c in API_CASES])
def test_the_python_apis_refuse_bad_input_saying_what_to_change(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_memory_limit_inf_is_no_limit():
    assert generate("zbv", num_ranks=2, num_microbatches=4, memory_limit=float("inf")) == generate(
        "zbv", num_ranks=2, num_microbatches=4)


# (file text, message): `bubbleless train FILE` exits 2 with one message and spawns nothing
CLI_CASES = [
    ("", "is empty: write the sections to change"),
    ("train:\n  steps: 1\ntrain:\n  steps: 2\n", "key 'train' is given twice"),
    ("optimizer: {lr: .nan}\n", "optimizer.lr must be a finite number > 0, got nan"),
    ("train: {log_every: 0}\n", "train.log_every must be at least 1"),
    ("train: {output_dir: /sys/bubbleless}\n", "train.output_dir '/sys/bubbleless' cannot be written ('/sys' would hold it)"),
    ("lora: {enabled: true, target_modules: [qkv]}\n", "lora.target_modules ['qkv'] match no linear layer"),
]


@pytest.mark.parametrize(("text", "message"), CLI_CASES, ids=[c[1][:40] for c in CLI_CASES])
def test_bubbleless_train_exits_2_before_spawning_with_one_message(tmp_path, monkeypatch, capsys, text, message):
    def never(*args, **kwargs):
        raise AssertionError("training started")

    # main starts a run through these names of cli (run_rank and run_pool live in train_loop)
    for name in ("launch", "run_rank", "run_pool"):
        monkeypatch.setattr(cli, name, never)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert cli.main(["train", str(path)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bubbleless: ") and message in lines[0], captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not os.path.exists(tmp_path / "bubbleless-run" / "checkpoint-1")
