"""What a split backward's W keeps from its I (each deferred linear's input and output gradient g) is in
the pool's memory plan: the profile measures it per layer (``pool_kept``), the walk holds it from I to W,
so the estimate is never under what the workers reserve and a budget at the estimate runs. Before, the
walk held the R-to-I bytes until W and missed the g of a linear whose output no later op saves."""

import torch
from torch import nn

from bubbleless_runtime._testing import reference_grads, relative_error
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_kept import KEPT_UNTIL_W
from bubbleless_runtime.pool_memory import device_peaks
from bubbleless_runtime.pool_plan import profile_layers
from bubbleless_runtime.pool_plan_cap import device_peak_walk
from bubbleless_schedules import Schedule

M, ROWS, WIDE, NARROW = 4, 1024, 256, 64


def _linear_pairs():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(NARROW, WIDE), nn.Linear(WIDE, NARROW)) for _ in range(6)])


def _sum_mse(out, target):
    return nn.functional.mse_loss(out, target, reduction="sum")


def _batch():
    torch.manual_seed(1)
    return torch.randn(ROWS, NARROW), torch.randn(ROWS, NARROW)


def _pipe(**kwargs):
    return RoundRobinPipeline(_linear_pairs(), devices=["cpu"] * 2, num_microbatches=M, loss_fn=_sum_mse,
                              timeout=60, precision="fp32", **kwargs)


def test_rt_pool_split_profile_counts_each_linears_input_and_output_gradient():
    """Linear(64, 256) -> Linear(256, 64) in fp32 keeps, per row, the layer's input (64 floats), the
    middle activation (256), and the output gradients of both linears (256 + 64): the middle's gradient is
    saved by no op, and was counted nowhere."""
    inputs, _ = _batch()
    rows = ROWS // M
    profile = profile_layers(list(_linear_pairs()), inputs[:rows], torch.device("cpu"), (None,))
    kept = [k * profile.tokens_per_microbatch for k in profile.extra[KEPT_UNTIL_W]]
    assert kept == [rows * (NARROW + WIDE + WIDE + NARROW) * 4] * 6


def test_rt_pool_split_plan_estimate_covers_what_the_step_reserves_and_a_budget_at_it_runs():
    inputs, targets = _batch()
    free = _pipe(partition="auto", sample_input=inputs[: ROWS // M], schedule_options={"split_backward": True})
    estimate = [peak for peak, _ in device_peaks(free.schedule, free.store, free.profile)]
    free.step(inputs, targets)
    reserved = [w.budget.peak for w in free.workers]
    assert all(e >= r for e, r in zip(estimate, reserved, strict=True)), (estimate, reserved)  # was 4.73 MB < 7.74 MB
    assert max(estimate) <= 1.05 * max(reserved), (estimate, reserved)  # and not far over

    model, ref = _linear_pairs(), _linear_pairs()
    held = RoundRobinPipeline(model, devices=["cpu"] * 2, num_microbatches=M, loss_fn=_sum_mse, timeout=60,
                              precision="fp32", schedule=free.schedule, partition=free.profile,
                              memory_budget=int(max(estimate)) + 1)
    loss = held.step(inputs, targets)
    want_loss, want = reference_grads(ref, inputs, targets, M, loss_fn=_sum_mse)
    got = {n: p.grad for n, p in model.named_parameters()}
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


def test_rt_pool_split_walk_holds_the_kept_bytes_from_i_to_w():
    """One job, two micro-batches: R-to-I bytes 10 each, 3 kept after I; the peak is 10 + 10 at 0I1 (0I0's
    micro-batch then holds 3: 13) with the kept figure, 20 without (both held in full until W)."""
    schedule = Schedule.from_text(
        "# bubbleless-schedule name=roundrobin stages=1 microbatches=2 layout=roundrobin meta.forward_layers= "
        "meta.last_layers=1 meta.backward_layers=\n0LOAD 0F0 0I0 0F1 0I1 0W0 0W1 0STORE\n")
    (kept,) = device_peak_walk(schedule, [0.0], [10.0], None, [3.0])
    (whole,) = device_peak_walk(schedule, [0.0], [10.0], None, [None])
    assert (kept.bytes, whole.bytes) == (13.0, 20.0)


def test_rt_pool_split_kept_figure_survives_a_yaml_round_trip(tmp_path):
    """The figure rides in Profile.extra, which a profile saved to YAML keeps (a list: safe_dump has no tuple)."""
    from bubbleless_partition import load_profile, save_profile

    inputs, _ = _batch()
    profile = profile_layers(list(_linear_pairs())[:2], inputs[: ROWS // M], torch.device("cpu"), (None,))
    save_profile(profile, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml").extra[KEPT_UNTIL_W] == list(profile.extra[KEPT_UNTIL_W])
