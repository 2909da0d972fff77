"""RoundRobinPipeline running a job whose micro-batches are split over two devices: each device uploads
the job's weights and stores its partial gradients, which the host accumulators sum."""

import re

import pytest

from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules import Action, Kind, Schedule
from bubbleless_schedules.roundrobin_layout import peak_weight_layers, pool_groups

CPU4 = ["cpu"] * 4
M = 4


def _base():
    """Jobs 0-1 forward, 2 the fused last group, 3-5 backward; job k on device k (mod 4), no LOAD/STORE."""
    return Schedule.from_text(
        "# bubbleless-schedule name=roundrobin stages=6 microbatches=4 layout=roundrobin meta.forward_layers=3,2 "
        "meta.last_layers=2 meta.backward_layers=1,2,2\n"
        "0F0 0F1 0F2 0F3 4R0 4B0 4R1 4B1 4R2 4B2 4R3 4B3\n1F0 1F1 1F2 1F3 5R0 5B0 5R1 5B1 5R2 5B2 5R3 5B3\n"
        "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3\n3R0 3B0 3R1 3B1 3R2 3B2 3R3 3B3\n")


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


HEADER = "# bubbleless-schedule name=roundrobin stages=3 microbatches=4 layout=roundrobin "
EMITTED = {
    # the fused group (5 layers) split over 3 devices, deferring W; job 1 twice on device 1
    "over-4-devices": HEADER + "meta.forward_layers=2 meta.last_layers=5 meta.backward_layers=2\n"
    "0LOAD 0F0 0F1 0F2 0F3 2LOAD 2R0 2I0 2W0 2R1 2I1 2W1 2R2 2I2 2W2 2R3 2I3 2W3 2STORE\n"
    "1LOAD 1F0 1I0 1F3 1I3 1W0 1W3 1STORE\n1LOAD 1F1 1I1 1W1 1STORE\n1LOAD 1F2 1I2 1W2 1STORE\n",
    # weight_limit=7: the fused group (6 layers) over all 4, device 1 running it between a backward job's R and B
    "inside-a-backward-job": HEADER + "meta.forward_layers=1 meta.last_layers=6 meta.backward_layers=1\n"
    "0LOAD 0F0 0F1 0F2 0F3 1LOAD 1F3 1B3 1STORE\n"
    "2LOAD 2R0 2R1 1LOAD 1F0 1B0 1STORE 2B0 2B1 2R2 2B2 2R3 2B3 2STORE\n"
    "1LOAD 1F1 1B1 1STORE\n1LOAD 1F2 1B2 1STORE\n",
}
"""What ``generate("roundrobin", layer_costs=...)`` emitted at f06d1d3 when a heavy fused group paces the
step (costs [1.0] x 6 + [4.0], 4 devices; with and without ``weight_limit=7``), written out so the test keeps
these shapes whatever the generator picks later."""


@pytest.mark.parametrize("shape", list(EMITTED))
def test_rt_pool_runs_the_fused_group_split_over_devices_as_the_generator_emits_it(shape):
    schedule = Schedule.from_text(EMITTED[shape])
    devices = {}
    for d, row in enumerate(schedule.actions):
        for a in row:
            if a.microbatch is not None:
                devices.setdefault(a.stage, set()).add(d)
    assert len(devices[pool_groups(schedule).last_stage]) >= 3  # the fused job on three or more devices
    pipe, model, ref, inputs, targets, loss = _run(schedule)
    want_loss, want = reference_grads(ref, inputs, targets, M)
    assert max(relative_error(p.grad, want[n]) for n, p in model.named_parameters()) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
