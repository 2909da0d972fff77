"""bubbleless train on a user's JSONL with a model directory: the loss drops, the validation loss is
evaluated every train.eval_every steps (into metrics.jsonl and the report), evaluation measures the
same loss training does, and a run resumed mid-epoch trains exactly the steps an uninterrupted run does."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))  # _data_fixtures, beside this file

from _data_fixtures import chats, tiny_tokenizer, write_jsonl  # noqa: E402

from bubbleless_runtime.models import build_causal_lm  # noqa: E402

TINY = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def model_dir(tmp_path) -> str:
    path = tmp_path / "model"
    build_causal_lm("llama", seed=0, **TINY).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


def config_text(tmp_path, out: str, *, steps: int, extra: str = "") -> str:
    data = write_jsonl(tmp_path / "chat.jsonl", chats(80))
    return f"""
model: {{path: {model_dir(tmp_path) if not (tmp_path / 'model').exists() else tmp_path / 'model'}}}
data: {{path: {data}, seq_len: 160, batch_size: 4, validation_fraction: 0.3, packing: true}}
pipeline: {{schedule: 1f1b, nproc: 2, num_microbatches: 2}}
optimizer: {{lr: 1.0e-2, warmup_steps: 1}}
train: {{steps: {steps}, eval_every: 2, log_every: 1, output_dir: {out}{extra}}}
"""


def train(tmp_path, name: str, text: str, *args: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, "-m", "bubbleless_runtime.cli", "train", str(path), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]


@pytest.mark.slow
def test_train_evaluate_and_resume_mid_epoch(tmp_path):
    out = str(tmp_path / "full")
    stdout = train(tmp_path, "full", config_text(tmp_path, out, steps=6, extra=", save_every: 4"))
    assert "data: 56 training samples" in stdout and "tokenized cache written" in stdout
    records = metrics(out)
    assert [r["step"] for r in records if "eval_loss" in r] == [2, 4, 6]
    assert records[-1]["loss"] < records[0]["loss"]
    assert "eval loss" in stdout
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(os.path.join(out, "model")))
    per_epoch = int(re.search(r"(\d+) batches per epoch", stdout).group(1))
    assert per_epoch < 4 and 4 % per_epoch  # step 4 resumes in the middle of the second epoch
    resumed_out = str(tmp_path / "resumed")
    stdout = train(tmp_path, "resumed", config_text(tmp_path, resumed_out, steps=6),
                   "--resume", os.path.join(out, "checkpoint-4"))
    assert "tokenized cache reused" in stdout
    full_losses = {r["step"]: r["loss"] for r in records}
    resumed = {r["step"]: r["loss"] for r in metrics(resumed_out)}
    assert sorted(resumed) == [5, 6]
    assert all(resumed[s] == pytest.approx(full_losses[s], rel=1e-6) for s in resumed), (resumed, full_losses)


def test_evaluation_measures_the_training_loss(tmp_path):
    """On one rank: evaluating on a batch gives the loss a training step on it reports, and leaves no gradient."""
    from bubbleless_runtime.data_batches import TokenBatches
    from bubbleless_runtime.data_eval import Evaluation
    from bubbleless_runtime.data_files import read_records
    from bubbleless_runtime.data_packing import pack
    from bubbleless_runtime.data_tokenize import tokenize_records
    from bubbleless_runtime.models import pipeline_model
    from bubbleless_runtime.pipeline import Pipeline
    from bubbleless_runtime.trainer import ScaledLoss, Trainer

    tok = tiny_tokenizer()
    found, records = read_records(write_jsonl(tmp_path / "c.jsonl", chats(12)))
    rows = pack(tokenize_records(records, found, tok, train_on_prompt=False, progress=False), 64)
    data = TokenBatches(rows=rows[:4], batch_size=4, seq_len=64, packing=True, pad_id=0)
    piped = pipeline_model(build_causal_lm("llama", seed=0, **TINY))
    loss = ScaledLoss(piped.loss_fn)
    pipe = Pipeline(piped.layers, schedule="1f1b", num_microbatches=2, loss_fn=loss)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.0)
    trainer = Trainer(pipeline=pipe, layers=piped.layers, loss=loss, optimizer=optimizer, num_microbatches=2)
    evaluated = Evaluation(data, 0).run(trainer)
    assert all(p.grad is None for p in pipe.parameters())
    assert trainer.train_step(data).loss == pytest.approx(evaluated, rel=1e-6)


def _forward_only_rank(rank, port, out, schedule):
    import torch.distributed as dist

    from bubbleless_runtime.data_eval import ForwardOnly
    from bubbleless_runtime.models import pipeline_model
    from bubbleless_runtime.pipeline import Pipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        piped = pipeline_model(build_causal_lm("llama", seed=0, **TINY))
        pipe = Pipeline(piped.layers, schedule=schedule, num_microbatches=4, loss_fn=piped.loss_fn)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, 300, (8, 16), generator=g)
        segments = torch.ones_like(ids)
        segments[:, 10:] = 2  # two documents per row
        evaluated = [ForwardOnly.of(pipe).step((ids, segments), ids) for _ in range(2)]  # the second reuses shapes
        no_grads = all(p.grad is None for p in pipe.parameters())
        trained = pipe.step((ids, segments), ids)
        torch.save({"eval": [None if e is None else float(e) for e in evaluated], "no_grads": no_grads,
                    "train": None if trained is None else float(trained)}, os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "1f1b"])
def test_forward_only_evaluation_on_two_ranks_gives_the_training_loss(tmp_path, schedule):
    import torch.multiprocessing as mp

    from bubbleless_runtime._testing import free_port

    mp.start_processes(_forward_only_rank, args=(free_port(), str(tmp_path), schedule), nprocs=2, start_method="fork")
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    assert all(r["no_grads"] for r in results)
    holder = [r for r in results if r["train"] is not None]
    assert len(holder) == 1
    assert holder[0]["eval"] == [pytest.approx(holder[0]["train"], rel=1e-6)] * 2


@pytest.mark.slow
def test_round_robin_pool_trains_and_evaluates_on_real_data(tmp_path):
    out = str(tmp_path / "pool")
    text = config_text(tmp_path, out, steps=3).replace(
        "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 2}",
        "pipeline: {schedule: roundrobin, devices: [cpu, cpu], num_microbatches: 2, partition: auto}")
    stdout = train(tmp_path, "pool", text)
    records = metrics(out)
    assert [r["step"] for r in records if "eval_loss" in r] == [2, 3]
    assert "packed into" in stdout
    from safetensors.torch import load_file

    trained = load_file(os.path.join(out, "model", "model.safetensors"))
    initial = load_file(tmp_path / "model" / "model.safetensors")
    assert trained.keys() == initial.keys()
    assert not torch.equal(trained["model.layers.0.mlp.down_proj.weight"], initial["model.layers.0.mlp.down_proj.weight"])
