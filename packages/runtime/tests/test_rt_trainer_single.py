"""Trainer on one process, driven through a plain sequential stand-in with the Pipeline interface.

The stand-in runs each micro-batch forward and backward in turn: exactly the gradients every real
schedule must reproduce, so what is tested here is the Trainer's own arithmetic.
"""

import math
import os
import re

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime._testing import (  # noqa: E402
    SequentialPipeline,
    stages_on_one_rank,
    tiny_hf_fields,
    tiny_loss,
    tiny_model,
)
from bubbleless_runtime.config import OptimizerConfig  # noqa: E402
from bubbleless_runtime.data import SyntheticTask  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402
from bubbleless_runtime.pipeline import Pipeline  # noqa: E402
from bubbleless_runtime.trainer import (  # noqa: E402
    ScaledLoss,
    Trainer,
    build_optimizer,
    seed_everything,
    warmup_cosine,
)


def make_trainer(
    *, seed=0, microbatches=2, grad_accum=1, precision="fp32", max_grad_norm=1.0, lr=1e-2, **fields
):
    seed_everything(seed)
    piped = pipeline_model(build_causal_lm("qwen3", seed=seed, **tiny_hf_fields(**fields)))
    loss = ScaledLoss(piped.loss_fn)
    pipe = SequentialPipeline(piped.layers, loss, microbatches)
    config = OptimizerConfig(lr=lr, warmup_steps=2)
    optimizer = build_optimizer(pipe.parameters(), config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(warmup_steps=2, total_steps=20, min_lr_ratio=0.1)
    )
    return Trainer(
        pipeline=pipe, layers=piped.layers, loss=loss, optimizer=optimizer, scheduler=scheduler,
        num_microbatches=microbatches, grad_accum=grad_accum, max_grad_norm=max_grad_norm, precision=precision,
    )  # fmt: skip


TASK = SyntheticTask(task="copy", num_symbols=8, length=4, batch_size=8, seed=3)


def test_loss_drops_on_the_synthetic_task():
    trainer = make_trainer(lr=1e-2)
    losses = [trainer.train_step(TASK).loss for _ in range(25)]
    assert losses[0] > 2.0 and min(losses[-5:]) < 0.8 * losses[0], losses


class Halves:
    """Batch i of TASK split in two: grad_accum=2 over these must equal one step on the whole batch."""

    def batch(self, index):
        ids, labels = TASK.batch(index // 2)
        half = slice(0, 4) if index % 2 == 0 else slice(4, 8)
        return ids[half], labels[half]


def test_gradient_accumulation_equals_one_big_batch():
    accumulated = make_trainer(microbatches=2, grad_accum=2)
    whole = make_trainer(microbatches=4, grad_accum=1)
    a = accumulated.train_step(Halves())
    b = whole.train_step(TASK)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    for p, q in zip(accumulated.params, whole.params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_clipping_uses_the_global_norm_and_bounds_it():
    trainer = make_trainer(max_grad_norm=1e-3)
    reference = make_trainer(max_grad_norm=0.0)
    reference.loss.factor = 1.0 / 2
    reference.pipeline.step(*TASK.batch(0))
    expected = torch.nn.utils.clip_grad_norm_(reference.params, max_norm=1e-3)
    trainer.loss.factor = 1.0 / 2
    trainer.pipeline.step(*TASK.batch(0))
    norm = trainer._clip()
    assert norm == pytest.approx(float(expected), rel=1e-5)
    clipped = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in trainer.params))
    assert clipped == pytest.approx(1e-3, rel=1e-3)
    for p, q in zip(trainer.params, reference.params, strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("text", ["optimizer: {max_grad_norm: 0}\n", "optimizer: {max_grad_norm: null}\n"])
def test_max_grad_norm_0_or_null_measures_the_norm_and_clips_nothing(text):
    """As 0 in Hugging Face's TrainingArguments (torch's clip_grad_norm_(max_norm=0) would zero the grads)."""
    from bubbleless_runtime.config import load_config
    from bubbleless_runtime.config_checks import validate

    max_grad_norm = validate(load_config(text=text)).optimizer.max_grad_norm
    assert max_grad_norm in (0.0, None)
    trainer = make_trainer(max_grad_norm=max_grad_norm)
    trainer.loss.factor = 1.0 / 2
    trainer.pipeline.step(*TASK.batch(0))
    before = [p.grad.clone() for p in trainer.params]
    norm = trainer._clip()
    assert norm == pytest.approx(math.sqrt(sum(float(g.double().pow(2).sum()) for g in before)), rel=1e-6)
    assert norm > 1e-3  # so a clip to any small norm would have changed the gradients
    assert all(torch.equal(p.grad, g) for p, g in zip(trainer.params, before, strict=True))


def test_tied_embedding_counted_once():
    trainer = make_trainer(tie_word_embeddings=True)
    embed = trainer.pipeline.modules[0].embed_tokens.weight
    assert embed is trainer.pipeline.modules[-1].lm_head.weight
    assert sum(p is embed for p in trainer.norm_owned) == 1


def test_bf16_autocast_trains_close_to_fp32():
    fp32, bf16 = make_trainer(), make_trainer(precision="bf16")
    a, b = fp32.train_step(TASK), bf16.train_step(TASK)
    assert b.loss == pytest.approx(a.loss, rel=0.03)
    assert b.loss != a.loss  # it did run in bfloat16: without autocast the two losses are one number
    assert not b.skipped and math.isfinite(b.grad_norm)


def test_fp16_scaler_skips_overflowing_steps_and_halves_the_scale():
    trainer = make_trainer(precision="fp16")
    trainer.scaler.scale = 2.0**100  # any fp16 gradient overflows at this scale
    before = [p.clone() for p in trainer.params]
    stats = trainer.train_step(TASK)
    assert stats.skipped and trainer.scaler.scale == 2.0**99
    assert math.isfinite(stats.loss)
    for p, q in zip(trainer.params, before, strict=True):
        assert torch.equal(p, q)
    assert trainer.scheduler.last_epoch == 0  # a skipped step leaves the learning-rate schedule where it was
    skipped_lr = stats.lr
    trainer.scaler.scale = 2.0**8
    stats = trainer.train_step(TASK)
    assert stats.lr == skipped_lr  # the warm-up's first rate again
    assert not stats.skipped and trainer.scaler.scale == 2.0**8
    assert trainer.scheduler.last_epoch == 1
    assert any(not torch.equal(p, q) for p, q in zip(trainer.params, before, strict=True))


def test_checkpoint_resume_reproduces_the_uninterrupted_run(tmp_path):
    straight = make_trainer()
    expected = [straight.train_step(TASK).loss for _ in range(6)]
    first = make_trainer()
    got = [first.train_step(TASK).loss for _ in range(3)]
    first.save(tmp_path)
    saved_rng = torch.get_rng_state()
    next_draw = torch.rand(())  # what the uninterrupted run would draw next
    torch.set_rng_state(saved_rng)
    resumed = make_trainer(seed=7)  # another seed: the checkpoint must restore the RNG, not rely on it
    resumed.load(tmp_path)
    assert torch.rand(()) == next_draw
    assert resumed.step == 3 and resumed.data_position == 3
    got += [resumed.train_step(TASK).loss for _ in range(3)]
    assert got == expected


def test_warmup_cosine_shape():
    f = warmup_cosine(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0) and f(9) == pytest.approx(0.55) and f(14) == pytest.approx(0.1)
    assert f(100) == pytest.approx(0.1)


def test_bad_trainer_input_raises():
    with pytest.raises(ValueError, match="precision"):
        make_trainer(precision="fp8")
    with pytest.raises(ValueError, match="optimizer.name"):
        build_optimizer([nn.Parameter(torch.ones(2))], OptimizerConfig(name="lion"))


def _cut_trainer(partition):
    model = tiny_model(4)
    loss = ScaledLoss(tiny_loss)
    pipe = Pipeline(model, schedule=stages_on_one_rank(2), num_microbatches=2, loss_fn=loss, partition=partition)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.1)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=optimizer, num_microbatches=2)


def test_resume_refuses_a_checkpoint_cut_elsewhere(tmp_path):
    """partition: auto may cut a resumed run elsewhere; loading would then put one layer's weights into
    another wherever the shapes agree (here the tiny model's identical blocks)."""
    _cut_trainer([1, 3]).save(tmp_path)
    with pytest.raises(ValueError, match=re.escape(
        "checkpoint was cut [1, 3] but this run cut [2, 2]; set pipeline.partition: [1, 3] to resume"
    )):
        _cut_trainer([2, 2]).load(tmp_path)
    same = _cut_trainer([1, 3])
    same.load(tmp_path)
    assert same.state_dict()["partition"] == [1, 3]



def test_tokens_count_the_real_tokens_of_a_padded_batch_not_the_padding(tmp_path):
    """Four documents of 3, 5, 9 and 7 tokens, right-padded to 16: the step reports their 24 tokens, not
    the 64 elements of the (4, 16) batch, and metrics' tokens_per_second divides those 24 by the seconds."""
    from bubbleless_runtime.data_batches import TokenBatches
    from bubbleless_runtime.data_tokenize import Sample
    from bubbleless_runtime.metrics import MetricsWriter

    def document(n):
        ids = [(n + i) % 30 + 1 for i in range(n)]
        return [Sample(ids, ids, "test")]

    data = TokenBatches(rows=[document(n) for n in (3, 5, 9, 7)], batch_size=4, seq_len=32, packing=False, pad_id=0)
    (ids, segments), _ = data.batch(0)
    assert ids.shape == (4, 16) and int((segments != 0).sum()) == 24  # the batch does hold padding
    piped = pipeline_model(build_causal_lm("qwen3", seed=0, **tiny_hf_fields()))
    loss = ScaledLoss(piped.loss_fn)
    pipe = Pipeline(piped.layers, schedule="1f1b", num_microbatches=2, loss_fn=loss)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=1e-2)
    trainer = Trainer(pipeline=pipe, layers=piped.layers, loss=loss, optimizer=optimizer, num_microbatches=2)
    stats = trainer.train_step(data)
    assert stats.tokens == 24
    with MetricsWriter(tmp_path, tensorboard=False) as metrics:
        record = metrics.log_stats(stats)
    assert record["tokens_per_second"] == pytest.approx(24 / stats.seconds)
