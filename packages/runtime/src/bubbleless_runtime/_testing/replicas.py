"""Private: what runs inside spawned ranks for the round-robin pools' data parallelism (``pool_replicas``).

Each rank is one replica: a ``RoundRobinPipeline`` over 2 CPU devices on its own batch, the replicas
joined by the default (gloo) group. The references are plain torch on the unpipelined model, fed the
mean over both replicas' batches' gradients, computed in every rank (both batches are known to each).
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist

from bubbleless_schedules.roundrobin_layout import PoolGroups

from . import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model

CUT = PoolGroups((3, 2), 2, (1, 2, 2))
SETTINGS = {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1, "max_grad_norm": 0.5}
MICROBATCHES = 4


def _pool(model, optimizer=None, group=None, timeout: float = 60):
    from ..pool import RoundRobinPipeline

    return RoundRobinPipeline(model, devices=["cpu"] * 2, num_microbatches=MICROBATCHES, loss_fn=tiny_loss,
                              partition=CUT, optimizer=optimizer, timeout=timeout,
                              data_parallel_group=dist.group.WORLD if group is None else group)


def _mean_grads(model, batches) -> dict:
    """The mean over ``batches`` of the unpipelined model's gradients (each batch's summed loss)."""
    grads = [reference_grads(model, x, y, MICROBATCHES)[1] for x, y in batches]
    return {name: sum(g[name] for g in grads) / len(grads) for name in grads[0]}


def _plain(model):
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=1e-2)


def _apply(model, optimizer, grads) -> None:
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    optimizer.zero_grad()


def _worst(model, want) -> float:
    return max(relative_error(p.detach(), w.detach()) for p, w in
               zip(model.parameters(), want.parameters(), strict=True))


def _checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def against_unpipelined(rank: int) -> dict:
    """Per mode, the worst relative error against the reference, and each mode's weights' checksum (equal on
    both replicas: they must stay identical without a broadcast)."""
    torch.set_num_threads(1)
    steps = [[tiny_batch(8, seed=10 * s + r) for r in range(2)] for s in range(3)]  # steps x replicas
    out: dict = {}

    # no optimizer: .grad holds the replicas' mean, and the replicas' own gradients really differ
    model = tiny_model(7)
    _pool(model).step(*steps[0][rank])
    want = _mean_grads(tiny_model(7), steps[0])
    own = reference_grads(tiny_model(7), *steps[0][rank], MICROBATCHES)[1]
    out["grad"] = max(relative_error(p.grad, want[n]) for n, p in model.named_parameters())
    out["replicas differ"] = min(relative_error(own[n], want[n]) for n in want)

    # the synchronous host optimizer, and accumulation (step 1 without an optimizer step: averaged once)
    model, masters = tiny_model(7), tiny_model(7)
    pipe, plain = _pool(model, SETTINGS), _plain(masters)
    pipe.step(*steps[0][rank])
    _apply(masters, plain, _mean_grads(copy.deepcopy(masters), steps[0]))
    pipe.step(*steps[1][rank], optimizer_step=False)
    pipe.step(*steps[2][rank])
    halves = [_mean_grads(copy.deepcopy(masters), steps[s]) for s in (1, 2)]
    _apply(masters, plain, {n: halves[0][n] + halves[1][n] for n in halves[0]})
    out["synchronous"], out["synchronous checksum"] = _worst(model, masters), _checksum(model)

    # the one-step-stale optimizer, steps overlapped: the average runs while the next step computes
    model, masters = tiny_model(7), tiny_model(7)
    running, plain = copy.deepcopy(masters), _plain(masters)
    pipe = _pool(model, {**SETTINGS, "asynchronous": True})
    for _ in pipe.steps([steps[s][rank] for s in range(3)]):
        pass
    pipe.synchronize()
    for s in range(3):  # each step's gradients on the weights before the previous step's update
        grads = _mean_grads(running, steps[s])
        next_running = copy.deepcopy(masters.state_dict())
        _apply(masters, plain, grads)
        running.load_state_dict(next_running)
    out["overlapped"], out["overlapped checksum"] = _worst(model, masters), _checksum(model)
    return out


def one_replica_stalls(rank: int, timeout: float) -> dict:
    """Rank 1 never steps (it sleeps past rank 0's timeout): rank 0's step raises, naming the all-reduce, and
    leaves no gradient behind (the recovery zeroes the sums a later step would have added to)."""
    torch.set_num_threads(1)
    model = tiny_model(7)
    pipe = _pool(model, SETTINGS, timeout=timeout)
    if rank == 1:
        time.sleep(timeout + 5)
        return {}
    started = time.monotonic()
    try:
        pipe.step(*tiny_batch(8, seed=1))
    except Exception as error:  # noqa: BLE001 - reported to the test
        message = f"{type(error).__name__}: {error}"
    else:
        message = "no error"
    return {"message": message, "seconds": time.monotonic() - started,
            "left": max(float(hp.grad.abs().max()) for hp in pipe.store.trainable)}


def other_models(rank: int) -> str:
    """Replica 1 builds its layers wider: both refuse at construction, before any step."""
    torch.set_num_threads(1)
    try:
        _pool(tiny_model(7, width=8 + 4 * rank))
    except ValueError as error:
        return str(error)
    return "no error"


REPLICA_CONFIG = """\
model: {architecture: qwen3, vocab_size: 32, hidden_size: 32, intermediate_size: 64, num_layers: 4, num_heads: 2,
        num_kv_heads: 1, head_dim: 16}
data: {task: sort, num_symbols: 16, length: 8, batch_size: 8}
pipeline: {schedule: roundrobin, devices: [cpu, cpu], partition: even, num_microbatches: 4}
optimizer: {name: adamw, lr: 3.0e-3, warmup_steps: 0, max_grad_norm: 1.0}
train: {steps: 8, save_every: 4, precision: fp32, seed: 0}
"""


def cli_replica(rank: int, config_path: str, out: str, extra: list[str]) -> dict:
    """``bubbleless train`` in a spawned rank (torchrun's environment: RANK and WORLD_SIZE set, the group
    joined): one data-parallel pool per rank. What it returned, the final weights' checksum, what it wrote."""
    import contextlib
    import io
    import os

    from ..cli import main
    from ..pool import RoundRobinPipeline

    built: list = []
    original = RoundRobinPipeline.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    RoundRobinPipeline.__init__ = keep
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = main(["train", config_path, "--output-dir", out, *extra])
    finally:
        RoundRobinPipeline.__init__ = original
    pipe = built[-1]
    return {"code": code, "printed": printed.getvalue(),
            "checksum": float(sum(hp.param.detach().double().sum() for hp in pipe.store.params)),
            "replicas": None if pipe.replicas is None else pipe.replicas.size,
            "files": sorted(os.listdir(out)) if os.path.isdir(out) else []}
