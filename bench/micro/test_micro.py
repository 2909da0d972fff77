"""Micro-benchmarks of the hot paths: schedule generation at p=32 m=256, simulation, the partition DP,
the executor's overhead per action, and one decoder layer of the measured tiny model against its modelled
cost on the measured CPU profile.

    pytest bench/micro --benchmark-json bench/results/micro.json

Each benchmark records what one call covers in ``extra_info`` (actions, layers), so a per-action or
per-layer cost can be read from the JSON. Timings are never asserted (no timed assertions): the
regression check compares deterministic figures, and these JSON files are records.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from bubbleless_partition import A800, analytic_profile, cut, shape
from bubbleless_runtime import Pipeline
from bubbleless_schedules import generate, simulate

P, M = 32, 256
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["1f1b", "interleaved-1f1b", "zb", "zbv"])
def test_generate_p32_m256(benchmark, name):
    schedule = benchmark.pedantic(generate, args=(name,), kwargs={"num_ranks": P, "num_microbatches": M},
                                  rounds=3, iterations=1)
    benchmark.extra_info.update(actions=sum(len(row) for row in schedule.actions), p=P, m=M)


@pytest.mark.parametrize("name", ["1f1b", "zbv"])
def test_simulate_p32_m256(benchmark, name):
    schedule = generate(name, num_ranks=P, num_microbatches=M)
    timeline = benchmark.pedantic(simulate, args=(schedule,), rounds=3, iterations=1)
    benchmark.extra_info.update(actions=len(timeline.spans), makespan=timeline.makespan)


@pytest.mark.parametrize("stages", [8, 32])
def test_partition_dp_qwen3_32b(benchmark, stages):
    profile = analytic_profile(shape("qwen3-32b"), A800, seq_len=2048)
    partition = benchmark(cut, profile, num_stages=stages, method="dp")
    benchmark.extra_info.update(layers=len(profile.layers), stages=stages, ratio=partition.ratio)


def test_executor_overhead_per_action(benchmark):
    """One rank, 1F1B over 64 micro-batches of a 1x1 linear: the step is almost all interpreter work."""
    torch.set_num_threads(1)
    m = 64
    layers = [nn.Linear(1, 1) for _ in range(2)]
    pipe = Pipeline(nn.Sequential(*layers), schedule="1f1b", num_microbatches=m,
                    loss_fn=lambda out, target: (out - target).pow(2).sum(), trace=False)
    x, y = torch.randn(m, 1), torch.randn(m, 1)
    benchmark(pipe.step, x, y)
    actions = sum(len(row) for row in pipe.lowered.actions)
    benchmark.extra_info.update(actions=actions, microbatches=m,
                                seconds_per_action=benchmark.stats.stats.median / actions)


@pytest.mark.benchmark(timer=time.thread_time)  # CPU time: another process holding the core costs nothing
def test_tiny_decoder_layer_forward_backward(benchmark):
    """One decoder layer of the measured tiny scenario (bench/measured/tiny.py), forward and backward over
    one micro-batch, 1 thread, beside what the calibration's cost model prices it at (``modelled_ms``: F + I
    + W of ``common.small_op_profile`` on the measured ``cpu`` profile, bench/modelled/cpu_ops.yaml)."""
    from bench.measured.calibration import tiny_shape
    from bench.measured.scenario import load_scenario
    from bench.measured.tiny import make_layers
    from bench.modelled.calibrate import cpu_point
    from bench.modelled.common import profile_of

    torch.set_num_threads(1)
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    layer = make_layers(scenario)[1]
    x = torch.randn(scenario.micro_batch, scenario.seq_len, scenario.model.hidden, requires_grad=True)
    grad = torch.randn_like(x)

    def step():
        layer(x).backward(grad)

    benchmark(step)
    point = cpu_point(tiny_shape(scenario), gpus=scenario.workers, seq_len=scenario.seq_len,
                      micro_batch=scenario.micro_batch, global_batch=scenario.global_batch, precision="fp32")
    modelled = profile_of(point, loss_chunk_tokens=None).layers[1].train_time
    benchmark.extra_info.update(modelled_ms=modelled, measured_over_modelled=benchmark.stats.stats.median * 1e3 / modelled)
