"""Config loading, the embedded default, the reference page, and the CLI's argument handling."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bubbleless_runtime import config as cfg
from bubbleless_runtime import config_docs
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
