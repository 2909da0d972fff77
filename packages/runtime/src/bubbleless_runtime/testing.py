"""Helpers the runtime's tests and benchmarks run inside spawned ranks (importable, so ``spawn`` can
pickle them): a tiny model that exercises every path, its unpipelined reference, and hand-written
schedules that use the split backward and V placement before the generators for them exist.

The tiny model passes a tuple ``(hidden, aux, index)`` between layers: a float tensor, a float
per-sample side sum (as MoE router statistics travel) and an integer tensor that carries no gradient.
Each block mixes a LayerNorm (gradient computed during I) with a Linear (gradient deferred to W).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from bubbleless_schedules import Action, Kind, Schedule, available, generate, v_placement


class Embed(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        index = torch.arange(x.shape[0], device=x.device) % 3
        return self.proj(x), x.new_zeros(x.shape[0]), index


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, activation):
        hidden, aux, index = activation
        out = hidden + torch.tanh(self.linear(self.norm(hidden))) + 0.01 * index.unsqueeze(-1)
        return out, aux + out.pow(2).mean(-1), index


def tiny_model(num_layers: int, width: int = 8, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(Embed(width), *[Block(width) for _ in range(num_layers - 1)]).double().float()


def tiny_loss(output, target):
    hidden, aux, _ = output
    return nn.functional.mse_loss(hidden, target, reduction="sum") + 0.01 * aux.sum()


def tiny_batch(batch: int, width: int = 8, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def reference_grads(model: nn.Module, inputs, targets, num_microbatches: int, loss_fn=tiny_loss):
    """The unpipelined run: sum over micro-batches of loss_fn(model(x_m), y_m); (loss, {name: grad})."""
    model.zero_grad(set_to_none=True)
    total = sum(loss_fn(model(x), y) for x, y in zip(inputs.chunk(num_microbatches), targets.chunk(num_microbatches),
                                                         strict=True))
    total.backward()
    return total.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def split_1f1b(num_ranks: int, num_microbatches: int) -> Schedule:
    """1F1B with each B split into I and a W run one slot later (and the rest at the end)."""
    base = generate("1f1b", num_ranks=num_ranks, num_microbatches=num_microbatches)
    rows = []
    for row in base.actions:
        out, pending = [], []
        for a in row:
            if a.kind is Kind.B:
                out.append(Action(a.stage, Kind.I, a.microbatch))
                out += pending
                pending = [Action(a.stage, Kind.W, a.microbatch)]
            else:
                out.append(a)
        rows.append(out + pending)
    return base.replace(actions=rows, name="split-1f1b")


def v_gpipe(num_ranks: int, num_microbatches: int) -> Schedule:
    """Two stages per rank in a V, GPipe order, split backward: every rank hands one activation to itself."""
    p, m = num_ranks, num_microbatches
    rows = []
    for r in range(p):
        first, second = r, 2 * p - 1 - r
        row = [Action(first, Kind.F, i) for i in range(m)] + [Action(second, Kind.F, i) for i in range(m)]
        row += [Action(second, Kind.I, i) for i in range(m)] + [Action(first, Kind.I, i) for i in range(m)]
        row += [Action(s, Kind.W, i) for s in (second, first) for i in range(m)]
        rows.append(row)
    return Schedule(rows, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p), name="v-gpipe")


def schedules_to_check(num_ranks: int, num_microbatches: int) -> dict:
    """Every registered stage-bound schedule that generates for this shape, plus the hand-written ones."""
    found, skipped = {}, {}
    for name in available():
        try:
            schedule = generate(name, num_ranks=num_ranks, num_microbatches=num_microbatches)
        except (ValueError, NotImplementedError) as exc:
            skipped[name] = str(exc).splitlines()[0]
            continue
        if schedule.stage_to_rank is None:
            skipped[name] = "not stage-bound"
            continue
        found[name] = schedule
    found["split-1f1b"] = split_1f1b(num_ranks, num_microbatches)
    found["v-gpipe"] = v_gpipe(num_ranks, num_microbatches)
    return {"schedules": found, "skipped": skipped}


def check_against_unpipelined(rank: int, num_microbatches: int, steps: int = 2) -> dict:
    """In each rank: run every schedule for ``steps`` steps and compare loss and gradients with the
    unpipelined model. Returns {name: (max relative gradient error, loss error or None)} and skips."""
    from .pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    found = schedules_to_check(num_ranks, num_microbatches)
    results = {}
    inputs, targets = tiny_batch(2 * num_microbatches)
    for index, (name, schedule) in enumerate(found["schedules"].items()):
        num_layers = schedule.num_stages + 1  # one uneven stage
        model, ref = tiny_model(num_layers), tiny_model(num_layers)
        ref_loss, ref_grads = reference_grads(ref, inputs, targets, num_microbatches)
        pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=tiny_loss, timeout=60,
                        prefetch=index % 3)  # receives posted 0, 1 or 2 compute actions ahead
        worst, loss_error = 0.0, None
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            loss = pipe.step(inputs, targets)
            if loss is not None:
                loss_error = abs(float(loss) - float(ref_loss)) / abs(float(ref_loss))
        owned = {id(p) for p in pipe.parameters()}
        for n, p in model.named_parameters():
            if id(p) in owned:
                worst = max(worst, relative_error(p.grad, ref_grads[n]))
        timeline = pipe.last_timeline
        results[name] = {
            "grad_error": worst, "loss_error": loss_error, "holds_loss": pipe.holds_loss,
            "spans": len(timeline.spans), "expected_spans": sum(len(r) for r in schedule.actions),
        }
    return {"results": results, "skipped": found["skipped"]}


def survive_a_dead_rank(rank: int, victim: int, timeout: float, out_dir: str) -> dict:
    """One good step, then ``victim`` dies (os._exit) and every other rank must raise within ``timeout``."""
    import json
    import os
    import time

    from .comm import PipelineCommError
    from .pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    model = tiny_model(num_ranks + 1)
    pipe = Pipeline(model, schedule="1f1b", num_microbatches=2 * num_ranks, loss_fn=tiny_loss, timeout=timeout)
    inputs, targets = tiny_batch(4 * num_ranks)
    pipe.step(inputs, targets)
    dist.barrier()
    if rank == victim:
        os._exit(17)
    started = time.monotonic()
    report = {"rank": rank, "error": None, "type": None}
    try:
        pipe.step(inputs, targets)
    except PipelineCommError as exc:
        report.update(error=str(exc), type=type(exc).__name__)
    report["elapsed"] = time.monotonic() - started
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    return report


def disagree_on_schedule(rank: int) -> str:
    """Rank 1 passes another schedule than the others: every rank must raise ValueError, none hang."""
    from .pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    name = "gpipe" if rank == 1 else "1f1b"
    pipe = Pipeline(tiny_model(num_ranks), schedule=name, num_microbatches=num_ranks, loss_fn=tiny_loss, timeout=20)
    try:
        pipe.step(*tiny_batch(2 * num_ranks))
    except ValueError as exc:
        return str(exc)
    return "no error"


def bad_input_then_good_step(rank: int) -> list[str]:
    """Every bad argument raises ValueError locally on every rank; a good step still runs afterwards,
    which shows no rank had started communicating."""
    from .pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    model = tiny_model(num_ranks + 1)
    inputs, targets = tiny_batch(2 * num_ranks)
    ok = dict(schedule="1f1b", num_microbatches=num_ranks, loss_fn=tiny_loss, timeout=20)
    attempts = {
        "ranks": lambda: Pipeline(model, **{**ok, "schedule": generate("1f1b", num_ranks=num_ranks + 1,
                                                                          num_microbatches=num_ranks)}),
        "loss": lambda: Pipeline(model, **{**ok, "loss_fn": None}),
        "cut": lambda: Pipeline(tiny_model(num_ranks - 1 or 1), **ok) if num_ranks > 1 else None,
        "partition": lambda: Pipeline(model, **ok, partition=[1] * num_ranks),
        "batch": lambda: Pipeline(model, **ok).step(*tiny_batch(2 * num_ranks + 1)),
    }
    messages = []
    for attempt in attempts.values():
        try:
            attempt()
        except ValueError as exc:
            messages.append(str(exc))
        else:
            messages.append("no error")
    Pipeline(model, **ok).step(inputs, targets)
    return messages


def data_parallel_2x2(rank: int, names: list[str]) -> dict:
    """4 ranks: pipelines {0,1} and {2,3}, replicas {0,2} and {1,3}, each replica on its own data.
    Gradients must equal the mean over replicas of the unpipelined model's."""
    from .pipeline import Pipeline

    torch.set_num_threads(1)
    pipelines = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, stage_rank = divmod(rank, 2)
    num_microbatches = 4
    errors = {}
    for name in names:
        schedule = generate(name, num_ranks=2, num_microbatches=num_microbatches)
        num_layers = schedule.num_stages + 1
        model = tiny_model(num_layers)
        batches = [tiny_batch(8, seed=10 + r) for r in range(2)]
        per_replica = [reference_grads(tiny_model(num_layers), x, y, num_microbatches)[1] for x, y in batches]
        pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=tiny_loss,
                        group=pipelines[replica], data_parallel_group=replicas[stage_rank], timeout=60)
        model.zero_grad(set_to_none=True)
        pipe.step(*batches[replica])
        owned = {id(p) for p in pipe.parameters()}
        worst = 0.0
        for n, p in model.named_parameters():
            if id(p) in owned:
                want = (per_replica[0][n] + per_replica[1][n]) / 2
                worst = max(worst, relative_error(p.grad, want))
                assert relative_error(per_replica[0][n], want) > 1e-3  # the replicas' data really differ
        errors[name] = worst
    return errors


def fail_on_rank(rank: int, failing: int | None) -> int:
    """Returns the rank, or raises KeyError on rank ``failing`` (to test exception propagation)."""
    if rank == failing:
        raise KeyError("broken on purpose")
    return rank
