"""Config loading, the embedded default, the reference page, and the CLI's argument handling."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bubbleless_runtime import config as cfg
from bubbleless_runtime import config_docs
from bubbleless_runtime.checkpoint import manifest_of
from bubbleless_runtime.cli import build_parser, main, resolve_config
from bubbleless_runtime.default_config import DEFAULT_CONFIG_YAML

DOCS = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_reference_page_is_generated_from_the_code_and_documents_every_field():
    assert DOCS.read_text() == config_docs.config_reference_markdown(), (
        "docs/config.md is stale: run python -m bubbleless_runtime.config_docs > packages/runtime/docs/config.md"
    )
    for section, cls in cfg.SECTIONS.items():
        for f in dataclasses.fields(cls):
            row = next(r for r in config_docs.field_docs()[cls.__name__] if r[0] == f.name)
            assert row[3], f"{section}.{f.name} has no docstring"
            assert f"`{section}.{f.name}`" in DOCS.read_text()


def test_embedded_default_is_the_documented_demo():
    config = cfg.load_config(text=DEFAULT_CONFIG_YAML)
    assert config.model.architecture == "qwen3"
    assert config.pipeline.schedule == "zbv" and config.pipeline.nproc == 4
    assert config.train.device == "cpu"


@pytest.mark.parametrize(
    "text,match",
    [
        ("optimizer:\n  lrr: 0.1\n", "unknown config key 'optimizer.lrr'"),
        ("trian:\n  steps: 3\n", "unknown config key 'trian'"),
        ("train:\n  steps: many\n", "'train.steps' expects int"),
        ("train:\n  steps: .inf\n", "'train.steps' expects int, got inf"),
        ("train:\n  precision: fp8\n", "train.precision"),
        ("data:\n  batch_size: 30\n", "not divisible"),
        ("model: 3\n", "must be a mapping"),
        ("model:\n  vocab_size: 8\n", "too small"),
        ("pipeline:\n  schedule: zbx\n", r"pipeline.schedule is 'zbx'; choose one of \['auto'.*aliases: zerobubble=zb"),
        ("pipeline:\n  partition: [3, 4]\n", "covers 7 layers but the model has 8 .*sum to 8"),
        ("pipeline:\n  partition: [8, 0]\n", "stage with no layers"),
    ],
)
def test_bad_config_raises_value_error_naming_the_key(text, match):
    with pytest.raises(ValueError, match=match):
        cfg.load_config(text=text)


def test_yaml_spellings_are_accepted(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: 1e-3\n  betas: [0.9, 0.99]\npipeline:\n  partition: [3, 5]\n")
    config = cfg.load_config(path)
    assert config.optimizer.lr == 1e-3 and config.optimizer.betas == [0.9, 0.99]
    assert config.pipeline.partition == [3, 5]
    with pytest.raises(ValueError, match="does not exist"):
        cfg.load_config(tmp_path / "missing.yaml")


def test_command_line_overrides_and_errors(tmp_path, capsys):
    args = build_parser().parse_args(["train", "--nproc", "2", "--steps", "7", "--schedule", "1f1b"])
    config = resolve_config(args)
    assert (config.pipeline.nproc, config.train.steps, config.pipeline.schedule) == (2, 7, "1f1b")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stepz: 1\n")
    assert main(["train", str(bad)]) == 2
    assert "unknown config key 'train.stepz'" in capsys.readouterr().err


def test_print_config_round_trips():
    out = subprocess.run(
        [sys.executable, "-c", "from bubbleless_runtime.cli import main; main(['train', '--print-config'])"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert cfg.load_config(text=out) == cfg.load_config(text=DEFAULT_CONFIG_YAML)


def test_choices_come_from_the_tables_that_implement_them():
    from bubbleless_runtime.config_checks import choices
    from bubbleless_runtime.data import TASKS
    from bubbleless_runtime.models.hf import ARCHITECTURES
    from bubbleless_runtime.trainer import AUTOCAST_DTYPES, OPTIMIZERS

    accepted = choices()
    assert accepted[("model", "architecture")] == tuple(ARCHITECTURES)
    assert accepted[("optimizer", "name")] == tuple(OPTIMIZERS)
    assert accepted[("train", "precision")] == tuple(AUTOCAST_DTYPES)
    assert accepted[("data", "task")] == tuple(TASKS)


def test_a_partition_or_schedule_that_cannot_run_stops_before_any_process_starts(tmp_path, capsys):
    """The schedule is generated for the run's rank count up front: ``train`` exits 2 with the reason."""
    cases = [
        ("pipeline: {schedule: zbv, nproc: 2, partition: [4, 4]}\n", "gives 2 stages but zbv on 2 ranks has 4"),
        ("pipeline: {schedule: roundrobin, nproc: 2}\n", "runs on a pool of devices: set pipeline.devices"),
        ("pipeline: {schedule: zbv, nproc: 4}\nmodel: {num_layers: 2}\n", "raise model.num_layers to at least 6"),
    ]
    for text, match in cases:
        path = tmp_path / "run.yaml"
        path.write_text(text)
        assert main(["train", str(path)]) == 2, text
        assert match in capsys.readouterr().err, text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where no GPU is visible")
def test_a_gpu_run_without_a_gpu_stops_before_any_process_starts(tmp_path, capsys):
    for text, field in (("train: {device: cuda}\n", "train.device is 'cuda'"),
                        ("pipeline: {backend: nccl}\n", "pipeline.backend is 'nccl'")):
        path = tmp_path / "run.yaml"
        path.write_text(text)
        assert main(["train", str(path)]) == 2, text
        err = capsys.readouterr().err
        assert field in err and "no GPU is visible" in err and "train.device: cpu" in err, err


def test_validating_a_config_imports_no_torch_trainer_or_pipeline(tmp_path):
    """Issue 12: load, validate and check the schedule of a YAML config in a fresh interpreter."""
    path = tmp_path / "run.yaml"
    path.write_text("pipeline: {schedule: 1f1b, nproc: 2}\nlora: {enabled: true}\noptimizer: {lr: 1.0e-3}\n")
    code = (
        "import sys\n"
        "from bubbleless_runtime.config import load_config\n"
        "from bubbleless_runtime.config_checks import check_schedule\n"
        f"config = load_config({str(path)!r})\n"
        "check_schedule(config, num_ranks=2)\n"
        "try:\n"
        "    load_config(text='optimizer: {lr: -1}')\n"
        "except ValueError:\n"
        "    pass\n"
        "loaded = [m for m in ('torch', 'transformers', 'bubbleless_runtime.trainer', 'bubbleless_runtime.pipeline')\n"
        "          if m in sys.modules]\n"
        "print(config.lora.enabled, loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True []", done.stdout + done.stderr


def test_the_config_modules_import_in_one_direction_only():
    """config_fields <- config_ranges <- config_checks <- config, config_docs, config_runtime: no module
    imports one to its right (nor config_fields any sibling), not even lazily inside a function."""
    import ast

    order = ["config_fields", "config_ranges", "config_checks", "config", "config_docs", "config_runtime"]
    source = Path(cfg.__file__).parent
    for position, name in enumerate(order):
        tree = ast.parse((source / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
                     and node.module is None for alias in node.names}
        later = set(order[position + 1:]) | ({"config"} if name in ("config_ranges", "config_checks") else set())
        assert not imported & later, f"{name} imports {sorted(imported & later)}"
        if name == "config_fields":
            assert not imported, f"config_fields imports {sorted(imported)}"


def test_config_names_match_the_tables_that_give_them_meaning():
    """``config_checks`` spells the accepted names out (no torch); each list equals its table."""
    from bubbleless_runtime import config_checks, config_ranges
    from bubbleless_runtime.models.hf import ARCHITECTURES, _derived_head_fields

    assert set(config_checks.ARCHITECTURES) == set(ARCHITECTURES)
    derived = {name for name, entry in ARCHITECTURES.items() if entry.fields is _derived_head_fields}
    assert set(config_ranges.DERIVED_HEAD_WIDTH) == derived


@pytest.mark.slow
def test_a_hand_edited_csv_schedule_trains_through_the_cli(tmp_path):
    """``pipeline.schedule: PATH``: a 1F1B schedule saved as CSV, one W moved later by hand, trains."""
    from bubbleless_runtime import _testing as testing
    from bubbleless_schedules import generate

    schedule = generate("zb-h1", num_ranks=2, num_microbatches=4)
    rows = [list(r) for r in schedule.actions]
    w = next(i for i, a in enumerate(rows[0]) if a.kind.value == "W")
    rows[0].append(rows[0].pop(w))  # the first W of rank 0 runs last: still valid, a different order
    edited = schedule.replace(actions=tuple(tuple(r) for r in rows), name="hand-edited")
    (tmp_path / "mine.csv").write_text(edited.to_csv())
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, "
        "num_kv_heads: 2, head_dim: 8}\ndata: {task: copy, num_symbols: 8, length: 4, batch_size: 8}\n"
        f"pipeline: {{schedule: {tmp_path / 'mine.csv'}, nproc: 2, num_microbatches: 4}}\n"
        "train: {steps: 3, checkpoint: true}\n"
    )
    done = testing.run_cli(["train", str(config), "--output-dir", str(tmp_path / "out")])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    ran = manifest_of(tmp_path / "out" / "checkpoint-3")["schedule"]["text"]  # the order the ranks ran
    assert ran == edited.to_text() and ran != schedule.to_text()
