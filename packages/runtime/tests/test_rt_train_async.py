"""``bubbleless train`` on the round-robin pool stepping the pool's host optimizer (``optimizer.asynchronous``):
the Trainer equal to torch AdamW applying each step's gradients one step late (LR schedule, accumulation,
clipping, the reported norm one step late), the synchronous host optimizer equal to the previous torch
optimizer over ``.grad``, evaluation and checkpoints draining the update in flight, exact resume, the
example, and the bad combinations."""

import copy
import json
import math

import pytest
import torch

from bubbleless_runtime import config as cfg
from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime._testing.train_runs import run_pool_fresh, sigterm_after_first_checkpoint
from bubbleless_runtime.checkpoint import load as load_checkpoint
from bubbleless_runtime.cli import main
from bubbleless_runtime.data_eval import Evaluation
from bubbleless_runtime.loss_scaling import ScaledLoss
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.roundrobin_config import ROUNDROBIN_CONFIG_YAML
from bubbleless_runtime.trainer import Trainer, warmup_cosine
from bubbleless_schedules.roundrobin_layout import PoolGroups

CUT = PoolGroups((3, 2), 2, (1, 2, 2))
LR, CLIP, ACCUM, MICRO = 1e-2, 0.5, 2, 4
SETTINGS = {"name": "adamw", "lr": LR, "betas": (0.9, 0.95), "weight_decay": 0.1, "max_grad_norm": CLIP}
FACTOR = warmup_cosine(warmup_steps=2, total_steps=6, min_lr_ratio=0.1)


class Batches:
    """``batch(i)``: the i-th tiny batch, as ``SyntheticTask`` gives them."""

    def batch(self, index: int):
        return tiny_batch(8, seed=index + 1)


def _trainer(model, optimizer, *, precision="fp32", scaler=None):
    """A Trainer over a 4-device CPU pool; ``optimizer``: host optimizer settings, or None (torch AdamW)."""
    loss = ScaledLoss(tiny_loss)
    pipe = RoundRobinPipeline(model, devices=["cpu"] * 4, num_microbatches=MICRO, loss_fn=loss, partition=CUT,
                              optimizer=optimizer, timeout=60)
    torch_optimizer = _plain(model) if optimizer is None else pipe.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(getattr(torch_optimizer, "torch_optimizer", torch_optimizer), FACTOR)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=torch_optimizer, scheduler=scheduler,
                   num_microbatches=MICRO, grad_accum=ACCUM, max_grad_norm=CLIP, precision=precision, scaler=scaler)


def _plain(model):
    """The runtime's ``build_optimizer`` groups with torch's default (foreach) AdamW."""
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.95))


class DelayedReference:
    """Plain torch AdamW over ``masters`` with the same LR schedule; each step's accumulated gradients are
    taken on ``running``, the weights before the previous step's update (what the stale pool runs on)."""

    def __init__(self, model):
        self.masters, self.running = copy.deepcopy(model), copy.deepcopy(model)
        self.plain = _plain(self.masters)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.plain, FACTOR)
        self.norms: list[float] = []

    def step(self, data, position: int) -> None:
        def scaled(output, target):
            return tiny_loss(output, target) / (MICRO * ACCUM)

        for index in range(position, position + ACCUM):
            _, grads = reference_grads(self.running, *data.batch(index), MICRO, loss_fn=scaled)
            for name, p in self.masters.named_parameters():
                p.grad = grads[name] if p.grad is None else p.grad + grads[name]
        before = copy.deepcopy(self.masters.state_dict())  # every update but this one
        self.norms.append(float(torch.nn.utils.clip_grad_norm_(self.masters.parameters(), CLIP)))
        self.plain.step()
        self.scheduler.step()
        self.plain.zero_grad()
        self.running.load_state_dict(before)


def _error(model, want) -> float:
    return max(relative_error(p.detach(), w.detach())
               for p, w in zip(model.parameters(), want.parameters(), strict=True))


def test_async_trainer_equals_adamw_applying_each_steps_accumulated_gradients_one_step_late():
    model, data = tiny_model(7), Batches()
    trainer = _trainer(model, {**SETTINGS, "asynchronous": True})
    reference = DelayedReference(tiny_model(7))
    stats = []
    for _ in range(5):
        stats.append(trainer.train_step(data))
        reference.step(data, (trainer.step - 1) * ACCUM)
        assert _error(model, reference.running) <= 1e-5  # the weights the next step runs on
    assert trainer.data_position == 5 * ACCUM
    assert [s.lr for s in stats] == pytest.approx([LR * FACTOR(k) for k in range(5)], rel=1e-12)
    assert math.isnan(stats[0].grad_norm)  # the first update is still in flight after the first step
    assert [s.grad_norm for s in stats[1:]] == pytest.approx(reference.norms[:4], rel=1e-5)  # one step late
    trainer.synchronize()
    assert _error(model, reference.masters) <= 1e-5
    assert _error(model, reference.running) > 1e-3  # the last update did move them: the test can tell


def test_sync_host_optimizer_equals_the_previous_torch_optimizer_over_grad_within_fp32_rounding():
    host_model, torch_model, data = tiny_model(7), tiny_model(7), Batches()
    host = _trainer(host_model, dict(SETTINGS))
    previous = _trainer(torch_model, None)
    assert host.host and not previous.host
    for _ in range(5):
        a, b = host.train_step(data), previous.train_step(data)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5) and a.lr == b.lr and a.loss == pytest.approx(b.loss)
    assert _error(host_model, torch_model) <= 1e-5


def test_fp16_sync_host_optimizer_unscales_with_the_trainers_scaler_as_the_torch_path_does():
    from bubbleless_runtime.loss_scaling import DynamicLossScaler

    host_model, torch_model, data = tiny_model(7), tiny_model(7), Batches()
    with pytest.raises(ValueError, match="give the Trainer the scaler the host optimizer unscales with"):
        _trainer(tiny_model(7), dict(SETTINGS), precision="fp16")
    scaler = DynamicLossScaler(initial_scale=2.0**10)
    host = _trainer(host_model, {**SETTINGS, "loss_scaler": scaler}, precision="fp16", scaler=scaler)
    previous = _trainer(torch_model, None, precision="fp16")
    previous.scaler.load_state_dict(scaler.state_dict())
    for _ in range(3):
        a, b = host.train_step(data), previous.train_step(data)
        assert not a.skipped and not b.skipped and a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    assert scaler.state_dict() == previous.scaler.state_dict()
    assert _error(host_model, torch_model) <= 1e-4


def test_evaluation_applies_the_update_in_flight_and_leaves_no_gradient_nor_update():
    class Validation:
        def in_order(self):
            return [tiny_batch(8, seed=100), tiny_batch(8, seed=101)]

    model, data = tiny_model(7), Batches()
    trainer = _trainer(model, {**SETTINGS, "asynchronous": True})
    reference = DelayedReference(tiny_model(7))
    for _ in range(2):
        trainer.train_step(data)
        reference.step(data, (trainer.step - 1) * ACCUM)
    steps = dict(trainer.optimizer.torch_optimizer.state_dict()["state"][0])["step"]
    loss = Evaluation(Validation(), every=0).run(trainer)
    assert math.isfinite(loss) and not trainer.optimizer.in_flight
    assert _error(model, reference.masters) <= 1e-5  # evaluated on the weights of every update so far
    assert all(not hp.grad.any() for hp in trainer.pipeline.store.trainable)
    assert dict(trainer.optimizer.torch_optimizer.state_dict()["state"][0])["step"] == steps
    assert trainer.loss.factor == 1.0 / (MICRO * ACCUM)


def test_an_in_process_async_checkpoint_resumes_bit_identically(tmp_path):
    data = Batches()
    whole = _trainer(tiny_model(7), {**SETTINGS, "asynchronous": True})
    for _ in range(3):
        whole.train_step(data)
    whole.save(tmp_path / "checkpoint-3")
    assert not whole.optimizer.in_flight  # saving applied the update in flight
    after = [whole.train_step(data) for _ in range(3)]
    resumed = _trainer(tiny_model(7, seed=5), {**SETTINGS, "asynchronous": True})  # other weights: all reloaded
    resumed.load(tmp_path / "checkpoint-3")
    assert resumed.step == 3 and resumed.data_position == 3 * ACCUM
    again = [resumed.train_step(data) for _ in range(3)]
    assert [(s.loss, s.grad_norm, s.lr) for s in again] == [(s.loss, s.grad_norm, s.lr) for s in after]
    assert math.isfinite(after[0].grad_norm)  # the update the save applied, reported by the next step
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a["masters"], b["masters"], strict=True))
    assert a["scheduler"] == b["scheduler"]
    for x, y in zip(a["optimizer"]["optimizer"]["state"].values(), b["optimizer"]["optimizer"]["state"].values(),
                    strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_a_checkpoint_of_the_other_optimizer_kind_is_refused_naming_both(tmp_path):
    _trainer(tiny_model(7), None).save(tmp_path / "torch")
    with pytest.raises(ValueError, match="written with a torch optimizer over .grad but this run steps the "
                                         "round-robin pool's host optimizer"):
        _trainer(tiny_model(7), dict(SETTINGS)).load(tmp_path / "torch")


# ---- the config key ----

@pytest.mark.parametrize("text,match", [
    ("optimizer: {asynchronous: true}\n", "optimizer.asynchronous runs the round-robin pool's host optimizer "
                                          "one step stale; zbv steps a torch optimizer on each rank"),
    ("pipeline: {schedule: roundrobin, devices: [cpu]}\noptimizer: {asynchronous: true}\ntrain: {precision: fp16}\n",
     "optimizer.asynchronous cannot use fp16's loss scaler .* set train.precision: bf16"),
    ("pipeline: {schedule: roundrobin, devices: [cpu]}\noptimizer: {asynchronous: 1}\n",
     "config key 'optimizer.asynchronous' expects bool, got 1"),
])
def test_bad_asynchronous_settings_raise_value_error_naming_the_key(text, match):
    with pytest.raises(ValueError, match=match):
        cfg.load_config(text=text)
    assert cfg.load_config(text="pipeline: {schedule: roundrobin, devices: [cpu]}\noptimizer: {asynchronous: true}\n")


def test_async_with_a_stage_bound_schedule_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("pipeline: {schedule: 1f1b}\noptimizer: {asynchronous: true}\n")
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optimizer.asynchronous runs the round-robin pool's host optimizer" in err, err


# ---- end to end, each run in a fresh interpreter ----

def _run(tmp_path, yaml_text, *args, name="run"):
    """``bubbleless train`` through the CLI's own path in a fresh interpreter; the per-step losses."""
    return run_pool_fresh(tmp_path, yaml_text, *args, name=name)[0]


TINY = """\
model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2,
        head_dim: 8}
data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}
optimizer: {lr: 1.0e-2, warmup_steps: 2, asynchronous: true}
pipeline: {schedule: roundrobin, devices: [cpu, cpu], num_microbatches: 2,
           partition: {forward: [2, 1], last: 1, backward: [1, 2]}}
train: {steps: 6, save_every: 3, grad_accum: 2}
"""


@pytest.mark.slow
def test_async_pool_resume_in_a_fresh_process_is_bit_identical_to_the_uninterrupted_run(tmp_path):
    whole = _run(tmp_path, TINY, name="whole")
    resumed = _run(tmp_path, TINY, "--resume", str(tmp_path / "whole" / "checkpoint-3"), name="resumed")
    assert len(whole) == 6 and resumed == whole[3:]

    def logged(name):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in rows if r["step"] > 3]

    assert logged("resumed") == logged("whole")  # the norm the checkpoint's drain applied included
    a = load_checkpoint(tmp_path / "whole" / "checkpoint-6")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoint-6")
    assert a["step"] == b["step"] == 6 and a["data_position"] == b["data_position"] == 12
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a["masters"], b["masters"], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a["params"], a["masters"], strict=True))  # fp32: drained, the same
    for x, y in zip(a["optimizer"]["optimizer"]["state"].values(), b["optimizer"]["optimizer"]["state"].values(),
                    strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def _example(steps: int, asynchronous: bool) -> str:
    text = ROUNDROBIN_CONFIG_YAML.replace("  max_grad_norm: 1.0\n",
                                          f"  max_grad_norm: 1.0\n  asynchronous: {str(asynchronous).lower()}\n")
    text = text.replace("  steps: 200\n", f"  steps: {steps}\n  checkpoint: true\n")
    assert f"asynchronous: {str(asynchronous).lower()}" in text and f"steps: {steps}" in text
    return text


def _pool_api_run(config, cut: dict, *, asynchronous: bool) -> list[torch.Tensor]:
    """The example's model and batches on ``RoundRobinPipeline`` driven directly: the weights after it."""
    from bubbleless_runtime.data_eval import training_data
    from bubbleless_runtime.train_pipelines import build_model, host_optimizer_settings
    from bubbleless_runtime.trainer import seed_everything

    seed_everything(config.train.seed)
    piped = build_model(config)
    data, _, _ = training_data(config)
    settings = {**host_optimizer_settings(config), "asynchronous": asynchronous}
    micro = config.pipeline.num_microbatches
    loss = ScaledLoss(piped.loss_fn)
    loss.factor = 1.0 / micro  # the mean over micro-batches, as the Trainer scales it
    pipe = RoundRobinPipeline(piped.layers, devices=config.pipeline.devices, num_microbatches=micro, loss_fn=loss,
                              partition=PoolGroups(tuple(cut["forward"]), cut["last"], tuple(cut["backward"])),
                              optimizer=settings)
    o = config.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(pipe.optimizer.torch_optimizer, warmup_cosine(
        warmup_steps=o.warmup_steps, total_steps=config.train.steps, min_lr_ratio=o.min_lr_ratio))
    for index in range(config.train.steps):
        pipe.step(*data.batch(index))
        scheduler.step()
    pipe.synchronize()
    return [p.detach().clone() for p in pipe.parameters() if p.requires_grad]


@pytest.mark.slow
def test_the_roundrobin_example_with_the_stale_optimizer_trains_and_equals_the_pool_api(tmp_path):
    steps = 8
    text = _example(steps, asynchronous=True)
    losses = _run(tmp_path, text, name="example")
    assert len(losses) == steps and sum(losses[-2:]) < sum(losses[:2])
    saved = load_checkpoint(tmp_path / "example" / f"checkpoint-{steps}")
    config = cfg.load_config(text=text)
    want = _pool_api_run(config, saved["partition"], asynchronous=True)
    errors = [relative_error(got, w) for got, w in zip(saved["params"], want, strict=True)]
    assert max(errors) <= 1e-5, max(errors)
    synchronous = _pool_api_run(config, saved["partition"], asynchronous=False)
    assert max(relative_error(got, w) for got, w in zip(saved["params"], synchronous, strict=True)) > 1e-4


@pytest.mark.slow
def test_sigterm_on_the_stale_pool_saves_the_drained_state_and_resume_latest_finishes(tmp_path):

    yaml_text = TINY.replace("steps: 6, save_every: 3, grad_accum: 2",
                             "steps: 400, save_every: 2, checkpoint: true, keep_checkpoints: 1")
    stopped_at, out, err = sigterm_after_first_checkpoint(tmp_path, yaml_text)
    saved = load_checkpoint(out / f"checkpoint-{stopped_at}")
    assert saved["step"] == stopped_at and saved["masters"] is not None
    assert all(torch.equal(p, m) for p, m in zip(saved["params"], saved["masters"], strict=True))  # drained
    finished = _run(tmp_path, yaml_text.replace("steps: 400", f"steps: {stopped_at + 2}"), "--resume",
                    str(out / f"checkpoint-{stopped_at}"), name="finished")
    assert len(finished) == 2 and all(math.isfinite(x) for x in finished)
