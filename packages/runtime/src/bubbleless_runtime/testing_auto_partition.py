"""What ``partition="auto"``'s tests run inside spawned ranks (importable, so ``spawn`` can pickle it).

The model has one layer about twenty times heavier than the others (a 16 -> 16384 -> 16 MLP among
16 -> 16 linears), so the profiled cut must differ from the even one whatever the machine's noise.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from bubbleless_schedules import generate

from .auto_partition import even_sizes
from .testing import reference_grads, relative_error

WIDTH = 16


def heavy_model(num_layers: int, heavy_at: int, seed: int = 0) -> nn.Sequential:
    """Small tanh layers with one wide MLP at ``heavy_at``."""
    torch.manual_seed(seed)
    layers = [
        nn.Sequential(nn.Linear(WIDTH, 16384), nn.Tanh(), nn.Linear(16384, WIDTH)) if i == heavy_at
        else nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        for i in range(num_layers)
    ]
    return nn.Sequential(*layers)


def sum_mse(output, target):
    return nn.functional.mse_loss(output, target, reduction="sum")


def heavy_batch(batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, WIDTH, generator=g), torch.randn(batch, WIDTH, generator=g)


def auto_against_unpipelined(rank: int, cases: list[tuple[str, int, int]], num_microbatches: int = 4) -> dict:
    """For each (schedule, layers, heavy layer): cut with ``partition="auto"``, step once, and compare
    loss and gradients with the unpipelined model. Returns what each rank saw, per schedule."""
    from .pipeline import Pipeline

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
            "even": even_sizes(num_layers, schedule.num_stages),
            "stage_forward": list(pipe.stage_costs.forward),
            "grad_error": worst,
            "loss_error": None if loss is None else abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
        }
    return results


def auto_with_data_parallel(rank: int, num_microbatches: int = 4) -> dict:
    """4 ranks: pipelines {0,1} and {2,3}, replicas {0,2} and {1,3}, each replica on its own data. Both
    pipelines must take replica 0's profile (same cut, same costs) and average the right gradients."""
    from .pipeline import Pipeline

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
