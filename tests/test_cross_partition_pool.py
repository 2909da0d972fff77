"""partition -> schedules -> the device pool: a round-robin cut is what the pool runs, in one convention.

``bubbleless_partition.cut(method="roundrobin")`` counts the fused last group at the end of both its
groupings; the schedule's ``PoolGroups`` keeps it apart. ``pool_plan.groups_from_partition`` is the one
conversion: the tests check it keeps every layer where the partition put it, that the schedule built
from it prices as the partition did (the simulator's jobs are the partition's jobs), and that the pool
runs the cut of a tiny Qwen3 with a heavy LM head to the unpipelined gradients.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_partition import RTX_4090, TransformerShape, analytic_profile, cut  # noqa: E402
from bubbleless_runtime._testing import relative_error, tiny_hf_fields  # noqa: E402
from bubbleless_runtime.pool import RoundRobinPipeline  # noqa: E402
from bubbleless_runtime.pool_plan import generate_pool, groups_from_partition, job_costs  # noqa: E402
from bubbleless_schedules import simulate  # noqa: E402

FIELDS = tiny_hf_fields(vocab_size=4096, num_hidden_layers=6, tie_word_embeddings=False)
SHAPE = TransformerShape(
    name="tiny-qwen3", num_layers=6, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=4096
)
M = 4


def _cut(num_groups: int = 3):
    profile = analytic_profile(SHAPE, RTX_4090, seq_len=12, micro_batch_size=2)
    return profile, cut(profile, num_stages=num_groups, method="roundrobin", num_microbatches=M)


def test_cross_pool_groups_keep_the_partitions_layers():
    profile, part = _cut()
    groups = groups_from_partition(part)
    assert groups.num_layers == profile.num_layers
    assert list(groups.forward) + [groups.last] == list(part.sizes)
    assert list(groups.backward) + [groups.last] == list(part.backward.sizes)
    for job in range(groups.last_stage):  # forward jobs are the partition's forward groups, in order
        assert list(groups.layers(job)) == list(part.layers_of(job))


def test_cross_the_schedule_prices_each_job_from_the_profile():
    """Every F, R and B of a job costs its layers' profiled times; LOAD the upload the partition charges."""
    profile, part = _cut()
    groups = groups_from_partition(part)
    costs = job_costs(profile, groups, bandwidth=profile.host_bandwidth)
    schedule = generate_pool("roundrobin", groups, num_layers=profile.num_layers, num_devices=3,
                             num_microbatches=M, costs=costs, options={})
    fields = {"F": ("forward",), "R": ("recompute",), "B": ("input_grad", "weight_grad")}
    seen = set()
    for span in simulate(schedule, costs).spans:
        layers = groups.layers(span.action.stage)
        kind = span.action.kind.value
        if kind == "LOAD":
            want = profile.upload_time(layers.start, layers.stop)
        else:
            want = sum(getattr(profile.layers[i], f) for i in layers for f in fields[kind]) if kind in fields else None
        if want is not None:
            assert span.end - span.start == pytest.approx(want), span
            seen.add(kind)
    assert seen == {"F", "R", "B", "LOAD"}


@pytest.mark.slow
def test_cross_the_pool_runs_the_cut_with_the_unpipelined_gradients():
    from bubbleless_runtime.models import build_causal_lm, pipeline_model

    _, part = _cut()
    model = build_causal_lm("qwen3", seed=0, **FIELDS)
    piped, ref = pipeline_model(model), pipeline_model(build_causal_lm("qwen3", seed=0, **FIELDS))
    ids = torch.randint(0, 4096, (2 * M, 12), generator=torch.Generator().manual_seed(3))
    pipe = RoundRobinPipeline(piped.layers, devices=["cpu"] * 3, num_microbatches=M, loss_fn=piped.loss_fn,
                              partition=part, timeout=120)
    assert pipe.groups == groups_from_partition(part)
    pipe.step(ids, ids)
    for x in ids.chunk(M):
        out = x
        for layer in ref.layers:
            out = layer(out)
        ref.loss_fn(out, x).backward()
    want = dict(ref.model.named_parameters())
    errors = [relative_error(p.grad, want[n].grad) for n, p in piped.model.named_parameters()]
    assert max(errors) <= 1e-5
