"""Resuming with other optimizer settings (lr, weight_decay, betas) applies the config's, says so once, and
leaves a resume with the same settings bit-identical: the stage-bound torch optimizer and the pool's host
optimizers (synchronous and one step stale)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bubbleless_runtime._testing import SequentialPipeline, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.loss_scaling import ScaledLoss
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.trainer import Trainer, build_optimizer, warmup_cosine
from bubbleless_schedules.roundrobin_layout import PoolGroups

FACTOR = warmup_cosine(warmup_steps=2, total_steps=8, min_lr_ratio=0.1)
SAVED = {"lr": 1e-2, "weight_decay": 0.1, "betas": (0.9, 0.95)}
CHANGED = {"lr": 3e-3, "weight_decay": 0.05, "betas": (0.8, 0.9)}


class Batches:
    def batch(self, index: int):
        return tiny_batch(8, seed=index + 1)


def _stage_bound(settings: dict, seed: int = 0) -> Trainer:
    """A one-rank Trainer as ``train_loop`` builds it: ``build_optimizer`` groups, LambdaLR over them."""
    model = tiny_model(3, seed=seed)
    loss = ScaledLoss(tiny_loss)
    pipe = SequentialPipeline(list(model), loss, 2)
    config = SimpleNamespace(name="adamw", eps=1e-8, momentum=0.0, **settings)
    optimizer = build_optimizer(pipe.parameters(), config)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=optimizer, num_microbatches=2,
                   scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, FACTOR))


def _pool(settings: dict, asynchronous: bool, seed: int = 0) -> Trainer:
    model = tiny_model(7, seed=seed)
    loss = ScaledLoss(tiny_loss)
    host = {"name": "adamw", "max_grad_norm": 0.5, "asynchronous": asynchronous, **settings}
    pipe = RoundRobinPipeline(model, devices=["cpu"] * 4, num_microbatches=4, loss_fn=loss,
                              partition=PoolGroups((3, 2), 2, (1, 2, 2)), optimizer=host, timeout=60)
    scheduler = torch.optim.lr_scheduler.LambdaLR(pipe.optimizer.torch_optimizer, FACTOR)
    return Trainer(pipeline=pipe, layers=list(model), loss=loss, optimizer=pipe.optimizer, scheduler=scheduler,
                   num_microbatches=4, max_grad_norm=0.5)


BUILDERS = {
    "stage-bound": _stage_bound,
    "pool": lambda settings, seed=0: _pool(settings, False, seed),
    "pool-async": lambda settings, seed=0: _pool(settings, True, seed),
}


def _groups(trainer) -> list[dict]:
    return getattr(trainer.optimizer, "torch_optimizer", trainer.optimizer).param_groups


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_rt_resume_applies_the_configs_lr_weight_decay_and_betas_and_says_so(kind, tmp_path, capsys):
    build, data = BUILDERS[kind], Batches()
    whole = build(SAVED)
    for _ in range(3):
        whole.train_step(data)
    whole.save(tmp_path / "checkpoint-3")
    kept = [whole.train_step(data) for _ in range(3)]  # the settings unchanged
    capsys.readouterr()

    same = build(SAVED, seed=5)
    same.load(tmp_path / "checkpoint-3")
    assert "resume:" not in capsys.readouterr().out
    again = [same.train_step(data) for _ in range(3)]
    assert [(s.loss, s.grad_norm, s.lr) for s in again] == [(s.loss, s.grad_norm, s.lr) for s in kept]

    changed = build(CHANGED, seed=5)
    changed.load(tmp_path / "checkpoint-3")
    out = capsys.readouterr().out
    assert out.count("resume:") == 1
    assert ("resume: the config's optimizer settings replace the checkpoint's: lr 0.01 -> 0.003; weight_decay 0.1 "
            "-> 0.05; betas (0.9, 0.95) -> (0.8, 0.9)") in out, out
    assert changed.scheduler.base_lrs == [CHANGED["lr"]] * len(_groups(changed))
    assert changed.scheduler.get_last_lr() == [CHANGED["lr"] * FACTOR(3)] * len(_groups(changed))
    assert [g["weight_decay"] for g in _groups(changed)] == [0.05, 0.0]  # none on norms and biases, as built
    assert all(g["betas"] == (0.8, 0.9) and g["initial_lr"] == CHANGED["lr"] for g in _groups(changed))
    steps = [changed.train_step(data) for _ in range(3)]
    assert [s.lr for s in steps] == [CHANGED["lr"] * FACTOR(step) for step in (3, 4, 5)]
    assert steps[0].loss == kept[0].loss  # the same weights resumed; then the new settings step them
    assert steps[2].loss != kept[2].loss  # (the one-step-stale optimizer's first update shows a step later)
