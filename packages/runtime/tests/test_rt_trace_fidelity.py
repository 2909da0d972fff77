"""The measured timeline and the simulator speak of the same thing.

- ``calibrated_costs`` inverts ``simulate``: from a simulated timeline it recovers the per-stage costs
  and the transfer latency exactly, so the simulated bubble under the recovered costs is the original.
- A real 2-rank run (gloo) records every compute action once, in the schedule's order, and a rank is
  idle only before an action that waits for another rank's tensor (posting transfers is work).
- Costs calibrated from that run keep its busy time and predict a makespan of the same order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bubbleless_runtime import spawn
from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime._testing.ranks import gathers_per_step
from bubbleless_runtime.trace import calibrated_costs, transfer_latencies
from bubbleless_schedules import Costs, Kind, generate, simulate
from bubbleless_schedules.layouts import layout_of


@pytest.mark.parametrize(
    ("name", "costs"),
    [
        ("zb-h1", Costs((1.0, 2.0, 1.5), (1.5, 2.5, 1.0), (0.5, 1.0, 0.75), 0.25)),
        ("zbv", Costs((1.0, 2.0, 1.5, 1.25), (1.5, 2.5, 1.0, 2.0), (0.5, 1.0, 0.75, 0.25), 0.5)),
        ("interleaved-1f1b", Costs((1.0,) * 6, (2.0,) * 6, (0.0,) * 6, 0.125)),
    ],
)
def test_rt_calibration_inverts_the_simulator(name, costs):
    stages = len(costs.forward)
    ranks = stages // 2 if name != "zb-h1" else stages
    schedule = generate(name, num_ranks=ranks, num_microbatches=2 * ranks)
    simulated = simulate(schedule, costs)
    latencies = transfer_latencies(simulated)
    assert latencies and all(abs(x - costs.comm) < 1e-9 for x in latencies)
    recovered = calibrated_costs(simulated)
    fused = any(a.kind is Kind.B for _, _, a in schedule.all_actions())
    assert recovered.forward == pytest.approx(costs.forward)
    if fused:  # a B carries I + W; calibration splits it evenly
        total = [i + w for i, w in zip(costs.backward_input, costs.backward_weight, strict=True)]
        assert [i + w for i, w in zip(recovered.backward_input, recovered.backward_weight, strict=True)] == \
            pytest.approx(total)
    else:
        assert recovered.backward_input == pytest.approx(costs.backward_input)
        assert recovered.backward_weight == pytest.approx(costs.backward_weight)
    assert recovered.comm == pytest.approx(costs.comm)
    assert simulate(schedule, recovered).bubble_rate == pytest.approx(simulated.bubble_rate)


def test_rt_latency_needs_a_wait():
    """Without communication cost nothing waits on a peer beyond the dependency itself: a simulated
    timeline at comm 0 yields latencies of exactly 0, and calibration keeps comm at 0."""
    schedule = generate("1f1b", num_ranks=3, num_microbatches=6)
    simulated = simulate(schedule, Costs(1.0, 2.0, 0.0, 0.0))
    assert all(x == 0.0 for x in transfer_latencies(simulated))
    assert calibrated_costs(simulated).comm == 0.0


def _traced_steps(rank: int, name: str, steps: int) -> dict:
    from bubbleless_runtime import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    schedule = generate(name, num_ranks=num_ranks, num_microbatches=4)
    model = tiny_model(schedule.num_stages, width=64)
    pipe = Pipeline(model, schedule=schedule, num_microbatches=4, loss_fn=tiny_loss)
    inputs, targets = tiny_batch(32, width=64)
    for _ in range(steps):
        pipe.step(inputs, targets)
    timeline = pipe.last_timeline
    return {"timeline": timeline, "schedule": schedule}


def _cross_rank_input(span, schedule) -> bool:
    layout = layout_of(schedule)
    made_on = {e: r for r, row in enumerate(schedule.actions) for a in row for e in layout.produces(a, schedule)}
    return any(made_on[e] != span.worker for e in layout.requires(span.action, schedule))


@pytest.fixture
def children_import_this_module(monkeypatch):
    """The spawned ranks unpickle ``_traced_steps`` by this module's dotted name (packages.runtime.tests...),
    which they can import as namespace packages once the repository root is on their ``sys.path``."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["1f1b", "zbv"])
def test_rt_measured_timeline_is_complete_and_idle_only_on_waits(name, children_import_this_module):
    per_rank = spawn(_traced_steps, 2, name, 3, threads_per_process=1, timeout=120)
    timeline, schedule = per_rank[0]["timeline"], per_rank[0]["schedule"]
    for worker, row in enumerate(timeline.per_worker):
        assert [s.action for s in row] == list(schedule.actions[worker])  # every action once, in order
        for previous, span in zip(row, row[1:], strict=False):
            assert previous.end <= span.start <= span.end
            if span.start > previous.end:  # idle: only where a peer's tensor was awaited
                assert _cross_rank_input(span, schedule), (worker, span.action)
    assert per_rank[1]["timeline"].spans == timeline.spans  # every rank gathers the same timeline

    costs = calibrated_costs(timeline)
    predicted = simulate(schedule, costs)
    busy = sum(timeline.busy(w) for w in range(schedule.num_workers))
    assert sum(predicted.busy(w) for w in range(schedule.num_workers)) == pytest.approx(busy)
    # Same busy time on two ranks bounds both makespans within [busy / 2, busy + transfers]; a factor of
    # 3 leaves room for any machine load while still catching a calibration off by an order of magnitude.
    assert timeline.makespan / 3 <= predicted.makespan <= timeline.makespan * 3


@pytest.mark.slow
def test_rt_steps_gather_nothing_until_the_timeline_is_read():
    """Tracing is free: a step makes no collective for it; the first read of ``last_timeline`` gathers
    once (on every rank), the next read returns the same timeline."""
    per_rank = spawn(gathers_per_step, 2, 3, threads_per_process=1, timeout=120)
    for rank, counts in enumerate(per_rank):
        assert counts["during_steps"] == 0, (rank, counts)
        assert counts["first_read"] == 1 and counts["second_read"] == 0, (rank, counts)
        assert counts["same_object"] and counts["spans"] == counts["expected_spans"], (rank, counts)
