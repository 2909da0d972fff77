"""``bubbleless train`` on the round-robin device pool: config checks, the example, exact resume, LoRA."""

import json
import re

import pytest
import torch

from bubbleless_runtime import _testing as testing
from bubbleless_runtime import config as cfg
from bubbleless_runtime._testing.train_runs import run_pool_fresh
from bubbleless_runtime.cli import main
from bubbleless_runtime.loss_scaling import ScaledLoss
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.roundrobin_config import ROUNDROBIN_CONFIG_YAML
from bubbleless_runtime.trainer import Trainer
from bubbleless_schedules.roundrobin_layout import PoolGroups

POOL = "pipeline: {schedule: roundrobin, devices: [cpu, cpu]}\n"


@pytest.mark.parametrize(
    "text,match",
    [
        ("pipeline: {schedule: roundrobin}\n", "runs on a pool of devices: set pipeline.devices"),
        ("pipeline: {schedule: zbv, devices: [cpu, cpu]}\n", "pipeline.devices is for the round-robin device pool"),
        ("pipeline: {schedule: 1f1b, memory_budget: 1.0e+9}\n", "pipeline.memory_budget is for the round-robin"),
        ("pipeline: {schedule: 1f1b, pin_memory: false}\n", "pipeline.pin_memory is for the round-robin"),
        ("pipeline: {schedule: 1f1b, weight_uploads: {window: 2}}\n", "pipeline.weight_uploads is for the round-robin"),
        (POOL.replace("}", ", weight_uploads: {chunk: 1}}"), r"unknown key\(s\) \['chunk'\]; the keys are paced, chunk_bytes"),
        (POOL.replace("}", ", weight_uploads: {window: 0}}"), "weight_uploads.window is 0; it needs at least 1 chunk"),
        (POOL.replace("}", ", weight_uploads: {chunk_bytes: -5}}"), "weight_uploads.chunk_bytes is -5"),
        (POOL.replace("}", ", weight_uploads: {paced: 1}}"), "weight_uploads.paced is 1; use true or false"),
        ("pipeline: {schedule: roundrobin, devices: [cpu, tpu]}\n", "entry 'tpu' is not a device"),
        ("pipeline: {schedule: roundrobin, devices: [cpu, 'cuda:0']}\n", "mixes cpu and cuda"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], memory_budget: -1}\n", "memory_budget must be a positive"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: auto, memory_cap: 1.0e+6}\n",
         "for roundrobin set pipeline.memory_budget"),
        (POOL + "train: {device: cuda}\n", "train.device is for stage-bound schedules"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: [4, 4]}\n",
         r"pipeline.partition \[4, 4\] is a list of layers per stage, a stage-bound cut"),
        ("pipeline: {schedule: 1f1b, partition: {forward: [3], last: 2, backward: [3]}}\n",
         "is a round-robin cut .* 1f1b binds stages to ranks"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: fast}\n", "for roundrobin use even, auto"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: [3, 3], last: 2}}\n",
         "needs exactly the keys forward, last and backward"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: [3, 3], last: 2, backward: [4, 1]}}\n",
         r"forward \[3, 3\] covers 6 layers but backward \[4, 1\] covers 5"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: [3, 2], last: 2, backward: [5]}}\n",
         r"covers 7 layers \(forward 5 \+ last 2\) but the model has 8 .* each sum to 6"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: [6, 0], last: 2, backward: [6]}}\n",
         r"pipeline.partition.forward \[6, 0\] has a group with no layers"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: [6], last: 0, backward: [6]}}\n",
         "pipeline.partition.last is 0"),
        ("pipeline: {schedule: roundrobin, devices: [cpu], partition: {forward: 6, last: 2, backward: [6]}}\n",
         "pipeline.partition.forward is 6; give a list"),
    ],
)
def test_bad_pool_config_raises_value_error_naming_the_key(text, match):
    with pytest.raises(ValueError, match=match):
        cfg.load_config(text=text)


def test_a_pool_cut_mapping_loads_and_round_trips_through_print_config(capsys):
    config = cfg.load_config(text="pipeline: {schedule: roundrobin, devices: [cpu, cpu], memory_budget: 1e9,\n"
                                  "           partition: {forward: [3, 3], last: 2, backward: [1, 2, 3]}}\n")
    assert config.pipeline.partition == {"forward": [3, 3], "last": 2, "backward": [1, 2, 3]}
    assert config.pipeline.memory_budget == 1e9 and config.pipeline.pin_memory is None
    assert main(["train", "--example", "roundrobin", "--print-config"]) == 0
    assert cfg.load_config(text=capsys.readouterr().out) == cfg.load_config(text=ROUNDROBIN_CONFIG_YAML)


def test_pool_runs_that_cannot_start_exit_2_with_the_reason(tmp_path, capsys, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text(POOL)
    assert main(["train", str(path), "--example", "roundrobin"]) == 2
    assert "give a config file or --example roundrobin, not both" in capsys.readouterr().err
    if not torch.cuda.is_available():
        path.write_text("pipeline: {schedule: roundrobin, devices: ['cuda:0', 'cuda:1']}\n")
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err
        assert "pipeline.devices lists 'cuda:0' but no GPU is visible here" in err, err


def _pool_trainer(groups):
    model = testing.tiny_model(7)
    loss = ScaledLoss(testing.tiny_loss)
    pipe = RoundRobinPipeline(model, devices=["cpu"] * 2, num_microbatches=2, loss_fn=loss, partition=groups)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.1)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=optimizer, num_microbatches=2)


def test_resume_refuses_a_pool_checkpoint_cut_elsewhere_naming_the_partition_to_pin(tmp_path):
    """An auto cut may come out differently on resume: the checkpoint names its cut in config form."""
    _pool_trainer(PoolGroups((3, 2), 2, (1, 2, 2))).save(tmp_path)
    with pytest.raises(ValueError, match=re.escape(
        "checkpoint was cut {forward: [3, 2], last: 2, backward: [1, 2, 2]} but this run cut {forward: [5], "
        "last: 2, backward: [5]}; set pipeline.partition: {forward: [3, 2], last: 2, backward: [1, 2, 2]} to resume"
    )):
        _pool_trainer(PoolGroups((5,), 2, (5,))).load(tmp_path)
    same = _pool_trainer(PoolGroups((3, 2), 2, (1, 2, 2)))
    same.load(tmp_path)
    assert same.state_dict()["partition"] == {"forward": [3, 2], "last": 2, "backward": [1, 2, 2]}
    assert cfg.load_config(text="pipeline: {schedule: roundrobin, devices: [cpu], partition: "
                                "{forward: [3, 2], last: 2, backward: [1, 2, 2]}}\nmodel: {num_layers: 5}\n")


# ---- end to end, each in a fresh interpreter ----

TINY = """\
model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}
optimizer: {lr: 1.0e-2, warmup_steps: 2}
"""
CUT = "{forward: [2, 1], last: 1, backward: [1, 2]}"  # 4 layers: embedding, 2 decoder layers, norm + head


def _run(tmp_path, yaml_text, *args, name="run", after=""):
    """``bubbleless train`` through the CLI's own path in a fresh interpreter: losses and stdout."""
    return run_pool_fresh(tmp_path, yaml_text, *args, name=name, after=after)


@pytest.mark.slow
def test_pool_resume_in_a_fresh_process_is_bit_identical_to_the_uninterrupted_run(tmp_path):
    """6 steps with checkpoints at 3 and 6; then a fresh process resumes the step-3 checkpoint to 6 (its
    pipeline.nproc differs: ignored by the pool). Losses, weights and optimizer state are bit-identical."""
    yaml_text = TINY + (f"pipeline: {{schedule: roundrobin, devices: [cpu, cpu], num_microbatches: 2, partition: {CUT}}}\n"
                        "train: {steps: 6, save_every: 3}\n")
    whole, out = _run(tmp_path, yaml_text, name="whole")
    assert len(whole) == 6 and "schedule roundrobin, 2 devices (cpu x2, one process: pipeline.nproc ignored)" in out
    resumed, _ = _run(tmp_path, yaml_text.replace("num_microbatches: 2", "num_microbatches: 2, nproc: 3"),
                      "--resume", str(tmp_path / "whole" / "checkpoint-3"), name="resumed")
    assert resumed == whole[3:]
    from bubbleless_runtime.checkpoint import load as load_checkpoint  # rank 0's files, nothing unpickled

    a = load_checkpoint(tmp_path / "whole" / "checkpoint-6")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoint-6")
    assert a["step"] == b["step"] == 6 and a["data_position"] == b["data_position"] == 6
    assert a["partition"] == b["partition"] == {"forward": [2, 1], "last": 1, "backward": [1, 2]}
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a["masters"], b["masters"], strict=True))
    state_a, state_b = a["optimizer"]["optimizer"]["state"], b["optimizer"]["optimizer"]["state"]  # the host optimizer's
    for x, y in zip(state_a.values(), state_b.values(), strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


SHOW_UPLOADS = """\
import bubbleless_runtime.pool as pool
built = pool.RoundRobinPipeline.__init__
def _show(self, *args, **kwargs):
    built(self, *args, **kwargs)
    uploads = self.workers[0].weights.uploads
    print("UPLOADS", uploads.paced, uploads.chunk_bytes, uploads.window)
pool.RoundRobinPipeline.__init__ = _show
"""


@pytest.mark.slow
def test_pool_weight_uploads_from_the_config_reach_every_device_and_change_no_loss(tmp_path):
    yaml_text = TINY + (f"pipeline: {{schedule: roundrobin, devices: [cpu, cpu], num_microbatches: 2, partition: {CUT}}}\n"
                        "train: {steps: 3}\n")
    plain, out = _run(tmp_path, yaml_text, name="plain", after=SHOW_UPLOADS)
    assert "UPLOADS False 33554432 2" in out  # CPU devices: issued at once by default
    paced, out = _run(tmp_path, yaml_text.replace("partition:", "weight_uploads: {paced: true, chunk_bytes: 256, "
                                                                "window: 1}, partition:"), name="paced", after=SHOW_UPLOADS)
    assert "UPLOADS True 256 1" in out
    assert paced == plain and len(plain) == 3  # chunked copies are exact copies


LOGITS_AFTER_TRAINING = """\
import torch
import bubbleless_runtime.train_loop as train_loop  # run_pool's loop looks _save_adapter up there
saved = {}
original = train_loop._save_adapter
def _capture(config, model, pipeline):  # the trained peft model, whose layers the pool trained in place
    saved["model"] = model
    return original(config, model, pipeline)
train_loop._save_adapter = _capture
import atexit
@atexit.register
def _logits():
    model = saved["model"].eval()
    with torch.no_grad():
        logits = model(input_ids=torch.arange(2, 14).reshape(2, 6)).logits
    torch.save(logits, config.train.output_dir + "/trained-logits.pt")
"""


@pytest.mark.slow
def test_pool_lora_saves_an_adapter_that_reproduces_the_trained_logits(tmp_path):
    from peft import PeftModel

    from bubbleless_runtime.models import build_causal_lm

    yaml_text = TINY + ("lora: {enabled: true, rank: 4, target_modules: [q_proj, v_proj, down_proj]}\n"
                        "pipeline: {schedule: roundrobin, devices: [cpu, cpu, cpu], num_microbatches: 2}\n"
                        "train: {steps: 4}\n")
    _, out = _run(tmp_path, yaml_text, name="lora", after=LOGITS_AFTER_TRAINING)
    adapter = tmp_path / "lora" / "lora-adapter"
    assert f"LoRA adapter  {adapter}" in out
    base = build_causal_lm("qwen3", seed=0, **testing.tiny_hf_fields(vocab_size=16))
    loaded = PeftModel.from_pretrained(base, adapter).eval()
    trained = [p for n, p in loaded.named_parameters() if "lora_B" in n]
    assert len(trained) == 3 * 2 and all(p.abs().sum() > 0 for p in trained)  # lora_B starts at zero
    with torch.no_grad():
        logits = loaded(input_ids=torch.arange(2, 14).reshape(2, 6)).logits
    want = torch.load(tmp_path / "lora" / "trained-logits.pt")
    assert torch.allclose(logits, want, rtol=0, atol=1e-6), (logits - want).abs().max()


@pytest.mark.slow
def test_the_roundrobin_example_runs_as_shipped(tmp_path):
    """README's second demo, cut to 8 steps: 4 CPU devices, auto partition, the loss falling, and a PNG
    and a Perfetto trace with one row per device and the LOAD/STORE spans in it."""
    done = testing.run_cli(["train", "--example", "roundrobin", "--steps", "8", "--output-dir", str(tmp_path)])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "schedule roundrobin, 4 devices (cpu x4, one process: pipeline.nproc ignored), 8 micro-batches, " \
           "8 steps" in out, out
    loss_line = next(line for line in out.splitlines() if line.startswith("loss"))
    first, last = (float(x) for x in loss_line.split()[1:4:2])
    assert last < first
    assert "auto cut    forward" in out and "even cut    forward" in out
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    trace = json.loads((tmp_path / "timeline.trace.json").read_text())
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {d: f"device {d}" for d in range(4)}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    kinds = {e["cat"] for e in spans}
    assert {"F", "R", "LOAD", "STORE"} <= kinds and ("B" in kinds or {"I", "W"} <= kinds)  # the plan picks B or I/W
    assert trace["otherData"]["time_unit"] == "s"
    assert 1e3 < max(e["ts"] + e["dur"] for e in spans) < 60e6  # a real step, in microseconds


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_cli_built_pool_plans_for_train_precision(precision):
    """``bubbleless train``'s pool is planned for the precision its steps run in (train.precision), not for
    the most any precision holds: RoundRobinPipeline(precision=...) gets it, and partition: auto profiles
    the layers in it alone."""
    from bubbleless_runtime.data_eval import sample_input_of, training_data
    from bubbleless_runtime.pool_precision import precisions_of
    from bubbleless_runtime.train_pipelines import build_model, pool_pipeline

    text = ROUNDROBIN_CONFIG_YAML.replace("precision: fp32", f"precision: {precision}")
    config = cfg.load_config(text=text.replace("devices: [cpu, cpu, cpu, cpu]", "devices: [cpu, cpu]"))
    assert config.train.precision == precision and config.pipeline.partition == "auto"
    piped = build_model(config)
    data, _, _ = training_data(config, rank=0)
    pipe = pool_pipeline(config, piped, ScaledLoss(piped.loss_fn), sample_input_of(data, config.pipeline.num_microbatches))
    assert pipe.precision == precision
    assert pipe.precisions == precisions_of(precision) and len(pipe.precisions) == 1
