"""The measured small-op physics of the CPU calibration (bench/modelled/cpu_ops.py, common.small_op_profile)
and the run-queue wait the measured runs record (bench/measured/common.py, runner)."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.measured.common import ThreadWatch, schedstat_delta, thread_schedstats  # noqa: E402
from bench.measured.runner import merge  # noqa: E402
from bench.measured.scenario import load_scenario  # noqa: E402
from bench.modelled.calibrate import calibrate, calibration_table, cpu_point  # noqa: E402
from bench.modelled.common import (  # noqa: E402
    Accumulation,
    Point,
    pipeline_accumulation,
    profile_of,
    sharded_accumulation,
)
from bench.modelled.cpu_ops import (  # noqa: E402
    OTHER_OPS_PER_LAYER,
    CpuHardware,
    SmallOps,
    elementwise_bytes_per_token,
    load_cpu_profile,
    measure_small_ops,
    ops_path,
    small_ops_from_dict,
    small_ops_to_dict,
    with_small_ops,
)
from bench.modelled.registry import predict  # noqa: E402
from bubbleless_partition import (  # noqa: E402
    HARDWARE,
    TransformerShape,
    analytic_profile,
    save_hardware,
)
from bubbleless_partition.analytic import LOGIT_BYTES, LOSS_PASSES  # noqa: E402

TINY = TransformerShape(name="tiny", num_layers=6, hidden=256, intermediate=768, heads=4, kv_heads=4, vocab=2048)
OPS = SmallOps(gemm_tflops=(0.1, 0.2, 0.4), attention_tflops=(0.05, 0.025), elementwise_gb_s=(10.0, 20.0),
               loss_gb_s=(8.0, 4.0), op_overhead_s=1e-5)


def _cpu(ops: SmallOps = OPS) -> CpuHardware:
    return with_small_ops(replace(HARDWARE["rtx4090"], name="cpu", kind="cpu"), ops)


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_cross_small_ops_gpu_profiles_keep_the_analytic_prices(name):
    hw = HARDWARE[name]
    point = Point(shape=TINY, hardware=hw, gpus=2, seq_len=256, global_batch=8)
    expected = analytic_profile(TINY, hw.for_dtype("bf16"), seq_len=256, dtype_bytes=2, loss_chunk_tokens=None)
    assert profile_of(point, loss_chunk_tokens=None).layers == expected.layers


def test_cross_small_ops_price_a_decoder_layer_and_the_head_as_documented():
    point = Point(shape=TINY, hardware=_cpu(), gpus=2, seq_len=256, global_batch=8, precision="fp32")
    prof = profile_of(point, loss_chunk_tokens=None)
    tokens = 256
    matmul = 2 * (TINY.attention_params() + TINY.mlp_params()[1]) * tokens
    attention = 2 * 4 * 64 * 256 * tokens
    memory = tokens * elementwise_bytes_per_token(256, 768, 4)
    dispatch_ms = OTHER_OPS_PER_LAYER * 1e-5 * 1e3 / 2
    layer = prof.layers[1]
    assert layer.forward == pytest.approx(matmul / 0.1e9 + attention / 0.05e9 + memory / 10e6 + dispatch_ms)
    assert layer.input_grad == pytest.approx(matmul / 0.2e9 + 2 * attention / 0.025e9 + 2 * memory / 20e6 + dispatch_ms)
    accumulate_ms = 7 / 8 * 3 * prof.layers[1].param_bytes / 20e6  # 8 micro-batches, all but the first
    assert layer.weight_grad == pytest.approx(matmul / 0.4e9 + accumulate_ms)
    assert layer.recompute == layer.forward
    head = prof.layers[-1]
    loss = tokens * 2048 * LOGIT_BYTES * LOSS_PASSES
    assert head.forward == pytest.approx(2 * 256 * 2048 * tokens / 0.1e9 + loss / 8e6 + tokens * 2 * 256 * 4 / 10e6)
    assert head.weight_grad == pytest.approx(2 * 256 * 2048 * tokens / 0.4e9 + 7 / 8 * 3 * head.param_bytes / 20e6)
    one = profile_of(point.at(global_batch=1), loss_chunk_tokens=None)  # one micro-batch: nothing to accumulate
    assert one.layers[1].weight_grad == pytest.approx(matmul / 0.4e9)
    # the embedding stays the analytic profile's but for the same accumulation in its W; what the memory
    # models read stays the analytic profile's
    plain = analytic_profile(TINY, _cpu().for_dtype("fp32"), seq_len=256, dtype_bytes=4)
    embedding = plain.layers[0]
    assert prof.layers[0].weight_grad == pytest.approx(embedding.weight_grad + 7 / 8 * 3 * embedding.param_bytes / 20e6)
    assert prof.layers[0] == replace(embedding, weight_grad=prof.layers[0].weight_grad)
    assert embedding.param_bytes == 2048 * 256 * 4
    assert [lay.param_bytes for lay in prof.layers] == [lay.param_bytes for lay in plain.layers]


def test_cross_small_ops_a_sharded_data_parallel_rank_accumulates_its_share_into_its_shard():
    """FSDP2 and ZeRO: a rank runs 8 / 2 micro-batches and adds each reduce-scattered gradient into its half."""
    point = Point(shape=TINY, hardware=_cpu(), gpus=2, seq_len=256, global_batch=8, precision="fp32")
    assert sharded_accumulation(point) == Accumulation(microbatches=4, held_share=0.5)
    assert pipeline_accumulation(point) == Accumulation(microbatches=8, held_share=1.0)
    pipeline = profile_of(point, loss_chunk_tokens=None)
    sharded = profile_of(point, loss_chunk_tokens=None, accumulation=sharded_accumulation(point))
    for index in (0, 1, -1):  # embedding, a decoder layer, the head
        size = pipeline.layers[index].param_bytes
        assert pipeline.layers[index].weight_grad - sharded.layers[index].weight_grad == pytest.approx(
            (7 / 8 - 3 / 4 * 0.5) * 3 * size / 20e6)
    with pytest.raises(ValueError, match="microbatches must be a positive int"):
        Accumulation(microbatches=0, held_share=1.0)
    with pytest.raises(ValueError, match="held_share"):
        Accumulation(microbatches=2, held_share=0.0)


def test_cross_small_ops_slower_rates_give_fewer_tokens_per_s_for_every_system():
    fast, slow = _cpu(), _cpu(replace(OPS, attention_tflops=(0.01, 0.005)))
    for system in ("bubbleless-1f1b", "zbv", "1f1b", "zero2", "roundrobin"):
        at = {hw: predict(system, cpu_point(TINY, hardware=hw, gpus=2, seq_len=256, global_batch=8,
                                            precision="fp32")).tokens_per_s for hw in (fast, slow)}
        assert at[slow] < at[fast], system


def test_cross_small_ops_refuse_bad_rates_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match="must be positive"):
        replace(OPS, loss_gb_s=(8.0, 0.0))
    assert small_ops_from_dict(small_ops_to_dict(OPS)) == OPS
    with pytest.raises(ValueError, match="not a small-op profile"):
        small_ops_from_dict({"format": "something else"})
    import yaml

    hw_path = tmp_path / "cpu.yaml"
    save_hardware(HARDWARE["rtx4090"], hw_path)
    assert not isinstance(load_cpu_profile(hw_path), CpuHardware)  # no rates beside it: priced as before
    ops_path(hw_path).write_text(yaml.safe_dump(small_ops_to_dict(OPS)))
    loaded = load_cpu_profile(hw_path)
    assert isinstance(loaded, CpuHardware) and loaded.small_ops == OPS
    assert loaded.for_dtype("bf16").small_ops == OPS  # the dtype view keeps them


def test_cross_small_ops_remeasuring_the_cpu_keeps_the_framework_and_split_costs(tmp_path, monkeypatch):
    """`model.py --measure-cpu` rewrites cpu_ops.yaml; the `framework`, `split_backward` and `adamw` entries come from
    their own commands and must survive (else the baselines' host work and the split would silently price
    at zero and at no extra cost)."""
    import yaml

    from bench.modelled import cpu_profile

    hw_path = tmp_path / "cpu.yaml"
    measured = with_small_ops(HARDWARE["rtx4090"], OPS)
    monkeypatch.setattr(cpu_profile, "measure_cpu", lambda: measured)
    stored = yaml.safe_load((ROOT / "bench/modelled/cpu_ops.yaml").read_text())
    kept = {k: stored[k] for k in ("framework", "split_backward", "adamw", "layout_backward")}
    ops_path(hw_path).write_text(yaml.safe_dump({**small_ops_to_dict(OPS), **kept}))
    cpu_profile.write_cpu_profile(hw_path)
    rewritten = yaml.safe_load(ops_path(hw_path).read_text())
    assert {k: rewritten[k] for k in kept} == kept
    loaded = load_cpu_profile(hw_path)
    assert None not in (loaded.framework, loaded.split_backward, loaded.adamw, loaded.layout_backward)


def test_cross_small_ops_measure_positive_rates_at_a_small_size():
    ops = measure_small_ops(tokens=16, hidden=32, intermediate=64, heads=2, vocab=64, repeats=1, cold_bytes=1 << 16)
    assert all(v > 0 for v in (*ops.gemm_tflops, *ops.attention_tflops, *ops.elementwise_gb_s, *ops.loss_gb_s))
    assert set(ops.sources) == {"gemm_tflops", "attention_tflops", "elementwise_gb_s", "loss_gb_s", "op_overhead_s"}


def test_cross_small_ops_schedstat_counts_cpu_and_the_longest_wait():
    one, two = ("1", 5), ("2", 9)
    # cpu summed over threads (300 ns + 1 s), the wait the longest of one thread (3 s against 7 s; a sum gives 10)
    assert schedstat_delta({one: (100, 50)}, {one: (400, 3_000_000_050), two: (1_000_000_000, 7_000_000_000)}) == (
        pytest.approx(1.0000003), pytest.approx(7.0))
    before = thread_schedstats()
    sum(i * i for i in range(200_000))
    cpu, wait = schedstat_delta(before, thread_schedstats())
    if before:  # Linux with schedstat
        assert cpu > 0 and wait >= 0


def test_cross_small_ops_schedstat_a_counter_that_went_back_is_a_new_thread():
    seven = ("7", 3)
    assert schedstat_delta({seven: (900, 900)}, {seven: (300, 200)}) == (pytest.approx(3e-7), pytest.approx(2e-7))


def test_cross_small_ops_schedstat_keys_a_thread_by_its_id_and_start_time():
    """An ended thread's id taken by a new one: told apart by the start time even where the new thread's
    counters are already past the old one's (which the counters alone cannot tell)."""
    import threading

    assert schedstat_delta({("7", 100): (900, 900)}, {("7", 250): (1000, 1000)}) == (
        pytest.approx(1e-6), pytest.approx(1e-6))
    readings = thread_schedstats()
    if not readings:
        pytest.skip("no Linux schedstat here")
    with open("/proc/self/stat") as f:
        process_start = int(f.read().rpartition(")")[2].split()[19])
    mine = [key for key in readings if key[0] == str(threading.get_native_id())]
    assert len(mine) == 1 and isinstance(mine[0][1], int) and mine[0][1] >= process_start


def _wait_for_polls(watch: ThreadWatch, count: int) -> None:
    deadline = time.monotonic() + 10
    while watch.polls < count and time.monotonic() < deadline:
        time.sleep(0.005)
    assert watch.polls >= count, "the watcher thread did not poll within 10 s"


def test_cross_small_ops_thread_watch_sees_a_thread_that_ended_within_the_step():
    """The round-robin pool's device threads start and end within each step: gone from /proc at its end."""
    import threading

    with ThreadWatch(period_s=0.01) as watch:
        def spin():
            end = time.thread_time() + 0.15
            while time.thread_time() < end:
                pass
            _wait_for_polls(watch, watch.polls + 2)  # a whole poll began after the spin: the thread's last reading

        before = watch.restart()
        if not before:
            pytest.skip("no Linux schedstat here")
        worker = threading.Thread(target=spin)
        worker.start()
        worker.join()
        tid, deadline = str(worker.native_id), time.monotonic() + 5
        while any(key[0] == tid for key in thread_schedstats()) and time.monotonic() < deadline:
            time.sleep(0.01)  # join returns before the OS thread is gone
        assert not any(key[0] == tid for key in thread_schedstats())
        after = watch.readings()
        cpu, _ = schedstat_delta(before, after)
        assert any(key[0] == tid for key in after), "the ended thread is kept at its last reading"
        assert cpu >= 0.14  # the ended thread's 0.15 s (schedstat may lag thread_time by a little)
        assert schedstat_delta(watch.restart(), watch.readings())[0] < 0.1  # restart forgets it


def test_cross_small_ops_thread_watch_drops_a_reading_taken_before_restart(monkeypatch):
    """The watcher reads /proc, loses the GIL, and records after the next step's restart: a thread that
    ended before the restart must not come back into the new step (its whole life counted from zero)."""
    import threading

    import bench.measured.common as common

    real = common.thread_schedstats
    read, go = threading.Event(), threading.Event()

    def slow():
        out = real()
        if threading.current_thread().name == "bench-thread-watch" and not read.is_set():
            read.set()
            go.wait(10)  # between the watcher's read and its record
        return out

    def spin():
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass
        read.wait(10)  # alive when the watcher reads

    monkeypatch.setattr(common, "thread_schedstats", slow)
    if not real():
        pytest.skip("no Linux schedstat here")
    worker = threading.Thread(target=spin)
    worker.start()
    with ThreadWatch(period_s=0.01) as watch:
        assert read.wait(10)
        worker.join()
        tid, deadline = str(worker.native_id), time.monotonic() + 5
        while any(key[0] == tid for key in real()) and time.monotonic() < deadline:
            time.sleep(0.01)
        before = watch.restart()  # the next step; the worker is gone
        assert not any(key[0] == tid for key in before)
        go.set()
        _wait_for_polls(watch, 1)  # the stale reading has been recorded or dropped
        after = watch.readings()
        assert not any(key[0] == tid for key in after)
        assert schedstat_delta(before, after)[0] < 0.1


@pytest.mark.parametrize("period_s", [0, -1, "a", None, float("inf"), float("nan"), True])
def test_cross_small_ops_thread_watch_refuses_a_bad_period(period_s):
    with pytest.raises(ValueError, match="period_s must be a finite positive number"):
        ThreadWatch(period_s=period_s)


def test_cross_small_ops_merge_takes_the_wait_out_of_each_step():
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    run = {"times": [2.0, 4.0, 1.0], "wait_s": [1.0, 0.0, 0.5], "cpu_s": [1.0, 1.0, 1.0], "losses": [1.0] * 5,
           "peak_growth_bytes": 1, "processes": 2, "threads": 1}
    merged = merge(scenario, [run])
    tokens = scenario.tokens_per_step
    assert merged["tokens_per_s"] == pytest.approx(tokens / 2.0)
    assert merged["tokens_per_s_less_wait"] == pytest.approx(tokens / 1.0)  # of 1.0, 4.0, 0.5 s
    assert merged["wait_share"] == pytest.approx(0.5)


def test_cross_small_ops_calibration_rows_carry_the_load_free_error():
    point = cpu_point(TINY, hardware=_cpu(), gpus=2, seq_len=256, global_batch=8, precision="fp32")
    rows = calibrate({"zero2": 100.0, "1f1b": 200.0}, point=point, load_free={"zero2": 400.0})
    by = {r.system: r for r in rows}
    assert by["zero2"].load_free_error == pytest.approx(by["zero2"].predicted_tokens_per_s / 400.0 - 1)
    assert by["1f1b"].load_free_error is None
    assert "| 1f1b | 200.0 | - |" in calibration_table(rows)
    with pytest.raises(ValueError, match="load-free tokens/s of 'zero2' must be positive"):
        calibrate({"zero2": 100.0}, point=point, load_free={"zero2": 0.0})


def test_cross_small_ops_an_interrupted_probe_stops_the_search(monkeypatch):
    from bench.measured import runner
    from bubbleless_runtime.signals import RunInterrupted

    def interrupted(*args, **kwargs):
        raise RunInterrupted("stopped by SIGTERM", 15)

    monkeypatch.setattr(runner, "run_system", interrupted)
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    with pytest.raises(RunInterrupted):
        runner.probe(scenario, "ddp", 256)


def test_cross_small_ops_an_entry_measured_by_its_own_command_keeps_the_others(tmp_path, monkeypatch):
    """adam_ops, split_ops and layout_ops store their entry through one writer: on one thread, the rest kept."""
    import torch
    import yaml

    from bench.modelled import cpu_profile
    from bench.modelled.ops_entry import write_ops_entry

    hw_path = tmp_path / "cpu.yaml"
    ops_path(hw_path).write_text(yaml.safe_dump({**small_ops_to_dict(OPS), "framework": {"value": 1}}))
    monkeypatch.setattr(cpu_profile, "DEFAULT_PATH", hw_path)
    threads = torch.get_num_threads()
    try:
        stored = write_ops_entry("adamw", lambda: {"value": [torch.get_num_threads()], "source": "test"})
    finally:
        torch.set_num_threads(threads)
    data = yaml.safe_load(ops_path(hw_path).read_text())
    assert stored == data["adamw"] == {"value": [1], "source": "test"}
    assert data["framework"] == {"value": 1} and data["gemm_tflops"] == small_ops_to_dict(OPS)["gemm_tflops"]
