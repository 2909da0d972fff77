"""RoundRobinPipeline running a job whose micro-batches are split over two devices: each device uploads
the job's weights and stores its partial gradients, which the host accumulators sum."""

import re

import pytest

from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import Action, Costs, Kind, generate
from bubbleless_schedules.roundrobin_layout import peak_weight_layers, pool_groups

CPU4 = ["cpu"] * 4
M = 4


def _base():
    """Jobs 0-1 forward, 2 the fused last group, 3-5 backward; job k on device k (mod 4), no LOAD/STORE."""
    return generate("roundrobin", num_ranks=4, num_microbatches=M, num_layers=7, forward_stages=[3, 2],
                    last_layers=2, backward_stages=[1, 2, 2], weight_transfers=False)


def _split(schedule, job, micro_batches, to_device, *, first):
    """Move ``job``'s actions of ``micro_batches`` to ``to_device``, before (``first``) or after its own."""
    rows = [[a for a in row if not (a.stage == job and a.microbatch in micro_batches)] for row in schedule.actions]
    moved = [a for a in schedule.actions[_device_of(schedule, job)] if a.stage == job and a.microbatch in micro_batches]
    rows[to_device] = moved + rows[to_device] if first else rows[to_device] + moved
    return schedule.replace(actions=rows)


def _device_of(schedule, job):
    return next(d for d, row in enumerate(schedule.actions) if any(a.stage == job for a in row))


SPLITS = {
    # the fused last group (LM head forward, loss, backward): its second half on the next device, first
    "fused-contiguous": lambda s: _split(s, 2, {2, 3}, 3, first=True),
    # a backward group (recompute then backward): odd micro-batches on another device, after its own job
    "backward-interleaved": lambda s: _split(s, 4, {1, 3}, 2, first=False),
    "both": lambda s: _split(_split(s, 2, {2, 3}, 3, first=True), 4, {1, 3}, 2, first=False),
}


def _run(schedule):
    model, ref = tiny_model(7), tiny_model(7)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=CPU4, num_microbatches=M, loss_fn=tiny_loss, schedule=schedule,
                              timeout=60)
    loss = pipe.step(inputs, targets)
    return pipe, model, ref, inputs, targets, loss


@pytest.mark.parametrize("split", list(SPLITS))
def test_rt_pool_split_job_gradients_and_loss_equal_unpipelined(split):
    pipe, model, ref, inputs, targets, loss = _run(SPLITS[split](_base()))
    want_loss, want = reference_grads(ref, inputs, targets, M)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    errors = {n: relative_error(got[n], want[n]) for n in want}
    assert max(errors.values()) <= 1e-5, errors
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
    # a second step adds the same gradients again: nothing of the split job is left over on a device
    pipe.step(inputs, targets)
    assert max(relative_error(p.grad, 2 * want[n]) for n, p in model.named_parameters()) <= 1e-5


def test_rt_pool_split_job_loads_and_stores_on_each_device_within_two_jobs_of_weights():
    pipe, *_ = _run(SPLITS["both"](_base()))
    schedule = pipe.schedule
    loads = {(d, a.stage) for d, row in enumerate(schedule.actions) for a in row if a.kind is Kind.LOAD}
    stores = {(d, a.stage) for d, row in enumerate(schedule.actions) for a in row if a.kind is Kind.STORE}
    assert {(2, 2), (3, 2), (0, 4), (2, 4)} <= loads and {(2, 2), (3, 2), (0, 4), (2, 4)} <= stores
    assert len(loads) == pool_groups(schedule).num_stages + 2  # one more upload per split job
    groups = pool_groups(schedule)
    biggest_two = sorted((len(groups.layers(j)) for j in range(groups.num_stages)), reverse=True)[:2]
    assert max(peak_weight_layers(schedule)) <= sum(biggest_two)
    for worker in pipe.workers:
        assert not worker.loaded and not worker.graphs  # every job's weights dropped, every graph consumed


def _without(schedule, actions):
    return schedule.replace(actions=[[a for a in row if a not in actions] for row in schedule.actions])


def _pipe(schedule):
    return RoundRobinPipeline(tiny_model(7), devices=CPU4, num_microbatches=M, loss_fn=tiny_loss, schedule=schedule)


def test_rt_pool_split_job_micro_batch_on_no_device_is_named():
    schedule = _without(SPLITS["fused-contiguous"](_base()), {Action(2, Kind.F, 3), Action(2, Kind.B, 3)})
    with pytest.raises(ValueError, match="micro-batch 3 of job 2 is on no device"):
        _pipe(schedule)


def test_rt_pool_split_job_micro_batch_on_two_devices_is_named():
    split = SPLITS["fused-contiguous"](_base())
    rows = [list(row) for row in split.actions]
    rows[3].remove(Action(2, Kind.B, 3))
    rows[2].append(Action(2, Kind.B, 3))  # its forward on device 3, its backward on device 2
    with pytest.raises(ValueError, match=re.escape("micro-batch 3 of last job 2 runs on devices [2, 3]")):
        _pipe(split.replace(actions=rows))


def test_rt_pool_split_job_micro_batch_run_twice_is_named():
    base = _base()
    rows = [list(row) for row in base.actions]
    rows[3] = [Action(2, Kind.F, 1), Action(2, Kind.B, 1)] + rows[3]  # also still on device 2
    with pytest.raises(ValueError, match=re.escape("has 2 of 2F1")):
        _pipe(base.replace(actions=rows))


@pytest.mark.parametrize("options", [{}, {"weight_limit": 7}])
def test_rt_pool_runs_the_split_the_roundrobin_generator_emits(options):
    """The shapes ``generate("roundrobin", layer_costs=...)`` emits when a heavy fused group paces the step:
    the fused group grown and split over 3 devices, or (no weight limit) over all 4."""
    layer_costs = Costs([1.0] * 6 + [4.0], [1.1] * 6 + [4.0], [1.1] * 6 + [4.0], 0.1)
    schedule = generate("roundrobin", num_ranks=4, num_microbatches=M, layer_costs=layer_costs, **options)
    devices = {}
    for d, row in enumerate(schedule.actions):
        for a in row:
            if a.microbatch is not None:
                devices.setdefault(a.stage, set()).add(d)
    assert any(len(where) >= 2 for where in devices.values())  # a job on two or more devices
    pipe, model, ref, inputs, targets, loss = _run(schedule)
    want_loss, want = reference_grads(ref, inputs, targets, M)
    assert max(relative_error(p.grad, want[n]) for n, p in model.named_parameters()) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
