"""What the cross-package tests (the repository's root ``tests/``) run inside spawned ranks: a schedule
loaded from CSV text, and a Hugging Face model cut where ``bubbleless_partition`` said, each against the
unpipelined model."""

from __future__ import annotations

import torch
import torch.distributed as dist

from bubbleless_schedules import generate

from . import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model


def csv_schedule_against_unpipelined(rank: int, csv_text: str, steps: int = 2) -> dict:
    """Every rank loads the schedule from ``csv_text`` (as a user would a hand-edited file), validates it and
    runs it; gradients and loss are compared with the unpipelined tiny model."""
    from bubbleless_schedules import Schedule, validate

    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    schedule = validate(Schedule.from_csv(csv_text))
    m = schedule.num_microbatches
    num_layers = schedule.num_stages + 1
    model = tiny_model(num_layers)
    inputs, targets = tiny_batch(2 * m)
    ref_loss, ref_grads = reference_grads(tiny_model(num_layers), inputs, targets, m)
    pipe = Pipeline(model, schedule=schedule, num_microbatches=m, loss_fn=tiny_loss, timeout=60)
    loss = None
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        loss = pipe.step(inputs, targets)
    owned = {id(p) for p in pipe.parameters()}
    return {
        "grad_error": max(relative_error(p.grad, ref_grads[n]) for n, p in model.named_parameters() if id(p) in owned),
        "loss_error": None if loss is None else relative_error(loss, ref_loss),
        "ran": [str(a) for a in pipe.schedule.actions[rank]],
    }


def cut_causal_lm_against_unpipelined(rank: int, fields: dict, schedule_name: str, sizes: list[int],
                                      num_microbatches: int = 4) -> dict:
    """A tiny Qwen3 (``fields``) cut into ``sizes`` on this group's ranks: gradients against the same model
    run unpipelined, micro-batch by micro-batch."""
    from ..models import build_causal_lm, pipeline_model
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    piped = pipeline_model(build_causal_lm("qwen3", seed=0, **fields))
    reference = pipeline_model(build_causal_lm("qwen3", seed=0, **fields))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, fields["vocab_size"], (2 * num_microbatches, 10), generator=g)
    for x, y in zip(ids.chunk(num_microbatches), ids.chunk(num_microbatches), strict=True):
        for layer in reference.layers:
            x = layer(x)
        reference.loss_fn(x, y).backward()
    schedule = generate(schedule_name, num_ranks=num_ranks, num_microbatches=num_microbatches)
    pipe = Pipeline(piped.layers, schedule=schedule, num_microbatches=num_microbatches, loss_fn=piped.loss_fn,
                    partition=sizes, timeout=120)
    pipe.step(ids, ids)
    want = {n: p.grad for n, p in reference.model.named_parameters() if p.grad is not None}
    owned = {id(p) for p in pipe.parameters()}
    errors = [relative_error(p.grad, want[n]) for n, p in piped.model.named_parameters()
              if id(p) in owned and p.grad is not None]
    return {"grad_error": max(errors), "checked": len(errors), "partition": list(pipe.partition),
            "layers_here": [len(m) for m in pipe.modules]}
