"""What the runtime's tests run inside spawned ranks (importable, so ``spawn`` can pickle them by name).

Each function takes the rank first, builds its models from ``_testing``'s helpers, and returns what the
test asserts on in the parent: errors measured against the unpipelined model, messages, counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from bubbleless_schedules import generate

from ..stages import stage_sizes
from . import (
    heavy_batch,
    heavy_model,
    reference_grads,
    relative_error,
    schedules_to_check,
    sum_mse,
    tiny_batch,
    tiny_loss,
    tiny_model,
)


def check_against_unpipelined(rank: int, num_microbatches: int, steps: int = 2) -> dict:
    """In each rank: run every schedule for ``steps`` steps and compare loss and gradients with the
    unpipelined model. Returns {name: (max relative gradient error, loss error or None)} and skips."""
    from ..pipeline import Pipeline

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

    from ..comm import PipelineCommError
    from ..pipeline import Pipeline

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
    from ..pipeline import Pipeline

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
    from ..pipeline import Pipeline

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
        "targets": lambda: Pipeline(model, **ok).step(inputs, targets[: num_ranks]),
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
    from ..pipeline import Pipeline

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


def gathers_per_step(rank: int, steps: int) -> dict:
    """All-gathers a traced pipeline makes: per step (after the first, which checks that the ranks agree),
    then on reading ``last_timeline`` twice. Steps must make none; the first read one, the second none."""
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    calls = []
    original = dist.all_gather

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_gather = counting
    try:
        pipe = Pipeline(tiny_model(num_ranks + 1), schedule="1f1b", num_microbatches=2 * num_ranks,
                        loss_fn=tiny_loss, timeout=60, trace=True)
        inputs, targets = tiny_batch(4 * num_ranks)
        pipe.step(inputs, targets)
        after_first = len(calls)
        for _ in range(steps):
            pipe.step(inputs, targets)
        during_steps = len(calls) - after_first
        first = pipe.last_timeline
        first_read = len(calls) - after_first - during_steps
        again = pipe.last_timeline
        second_read = len(calls) - after_first - during_steps - first_read
    finally:
        dist.all_gather = original
    return {"during_steps": during_steps, "first_read": first_read, "second_read": second_read,
            "same_object": first is again, "spans": len(first.spans),
            "expected_spans": sum(len(row) for row in pipe.schedule.actions)}


def transfer_groups(rank: int) -> dict:
    """Which group each direction of this rank's transfers travels on (by group name), from two pipelines
    over the default group; the second must reuse the first's twin group rather than create another."""
    from ..comm import Transfer
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    pipes = [Pipeline(tiny_model(4), schedule="1f1b", num_microbatches=2, loss_fn=tiny_loss, timeout=60)
             for _ in range(2)]
    channels = [p._executor.channel for p in pipes]

    def name(channel, is_send: bool, peer: int) -> str:
        group = channel.group_of(Transfer(is_send, peer, torch.empty(0), 0, ""))
        return (group or dist.group.WORLD).group_name

    peers = [r for r in range(dist.get_world_size()) if r != rank]
    return {"send": {peer: name(channels[0], True, peer) for peer in peers},
            "receive": {peer: name(channels[0], False, peer) for peer in peers},
            "twin_reused": channels[0].downward is channels[1].downward}


def fail_on_rank(rank: int, failing: int | None) -> int:
    """Returns the rank, or raises KeyError on rank ``failing`` (to test exception propagation)."""
    if rank == failing:
        raise KeyError("broken on purpose")
    return rank


# ---- partition="auto" ----


def auto_against_unpipelined(rank: int, cases: list[tuple[str, int, int]], num_microbatches: int = 4) -> dict:
    """For each (schedule, layers, heavy layer): cut with ``partition="auto"``, step once, and compare
    loss and gradients with the unpipelined model. Returns what each rank saw, per schedule."""
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    results = {}
    inputs, targets = heavy_batch(8 * num_microbatches)
    for name, num_layers, heavy_at in cases:
        schedule = generate(name, num_ranks=num_ranks, num_microbatches=num_microbatches)
        model, ref = heavy_model(num_layers, heavy_at), heavy_model(num_layers, heavy_at)
        ref_loss, ref_grads = reference_grads(ref, inputs, targets, num_microbatches, loss_fn=sum_mse)
        pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=sum_mse,
                        partition="auto", sample_input=inputs.chunk(num_microbatches)[0], timeout=60)
        model.zero_grad(set_to_none=True)
        loss = pipe.step(inputs, targets)
        owned = {id(p) for p in pipe.parameters()}
        worst = max(relative_error(p.grad, ref_grads[n]) for n, p in model.named_parameters() if id(p) in owned)
        results[name] = {
            "sizes": list(pipe.partition),
            "even": stage_sizes(num_layers, schedule.num_stages),
            "stage_forward": list(pipe.stage_costs.forward),
            "grad_error": worst,
            "loss_error": None if loss is None else abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
        }
    return results


def auto_with_data_parallel(rank: int, num_microbatches: int = 4) -> dict:
    """4 ranks: pipelines {0,1} and {2,3}, replicas {0,2} and {1,3}, each replica on its own data. Both
    pipelines must take replica 0's profile (same cut, same costs) and average the right gradients."""
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    pipelines = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, stage_rank = divmod(rank, 2)
    schedule = generate("1f1b", num_ranks=2, num_microbatches=num_microbatches)
    batches = [heavy_batch(8 * num_microbatches, seed=10 + r) for r in range(2)]
    per_replica = [reference_grads(heavy_model(4, 0), x, y, num_microbatches, loss_fn=sum_mse)[1] for x, y in batches]
    model = heavy_model(4, 0)
    inputs, targets = batches[replica]
    pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=sum_mse,
                    partition="auto", sample_input=inputs.chunk(num_microbatches)[0], group=pipelines[replica],
                    data_parallel_group=replicas[stage_rank], timeout=60)
    model.zero_grad(set_to_none=True)
    pipe.step(inputs, targets)
    owned = {id(p) for p in pipe.parameters()}
    worst = max(relative_error(p.grad, (per_replica[0][n] + per_replica[1][n]) / 2)
                for n, p in model.named_parameters() if id(p) in owned)
    return {"sizes": list(pipe.partition), "stage_forward": list(pipe.stage_costs.forward), "grad_error": worst}
