"""bench/measured's zero-infinity-nvme (issue 10, sections 1-2): DeepSpeed ZeRO-Infinity swapping
parameters and optimizer state to disk through its async_io op trains the same problem as its CPU
offload (same loss), and a config that cannot swap says what to change."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured import baselines  # noqa: E402
from bench.measured.scenario import Scenario, TinyShape, load_scenario  # noqa: E402

# The embedding and LM head (2048 x 256) are 1 MiB per rank over 2 ranks: DeepSpeed's smallest swappable
# partition (baselines.AIO), so parameters as well as optimizer state go to disk.
SHAPE = Scenario(name="nvme-test", model=TinyShape(layers=2, hidden=256, heads=4, intermediate=256, vocab=2048),
                 seq_len=32, global_batch=4, microbatches=4, steps=1, warmup=1, rounds=1,
                 systems=("zero-infinity", "zero-infinity-nvme"))


def test_cross_bench_nvme_the_scenario_runs_the_nvme_system_beside_cpu_offload_and_ours():
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny-nvme.yaml")
    assert {"zero-infinity", "zero-infinity-nvme", "roundrobin", "1f1b"} <= set(scenario.systems)
    assert scenario.model == load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml").model


def test_cross_bench_nvme_the_config_swaps_everything_to_the_directory_given():
    config = baselines.deepspeed_config(SHAPE, stage=3, world=2, device="nvme", nvme_path="/disk/swap")
    zero = config["zero_optimization"]
    assert zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "nvme"
    assert zero["offload_param"]["nvme_path"] == zero["offload_optimizer"]["nvme_path"] == "/disk/swap"
    assert zero["offload_param"]["buffer_size"] == 2048 * 256 and zero["offload_param"]["max_in_cpu"] == 0
    assert zero["stage3_prefetch_bucket_size"] == 0 and config["aio"] == baselines.AIO
    cpu = baselines.deepspeed_config(SHAPE, stage=3, world=2)
    assert "aio" not in cpu and cpu["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}


@pytest.mark.parametrize(("change", "message"), [
    ({"stage": 2, "nvme_path": "/disk/swap"}, "NVMe offload is ZeRO stage 3 .*got stage 2"),
    ({"stage": 3, "nvme_path": None}, "with an nvme_path .*nvme_path None"),
])
def test_cross_bench_nvme_a_config_that_cannot_swap_says_what_to_change(change, message):
    with pytest.raises(ValueError, match=message):
        baselines.deepspeed_config(SHAPE, world=2, device="nvme", **change)
    with pytest.raises(ValueError, match="offload device must be one of cpu, nvme, got 'disk'"):
        baselines.deepspeed_config(SHAPE, stage=3, world=2, device="disk")


def _nvme_runs_here() -> str:
    """Why the NVMe system cannot run in this checkout ("" when it can)."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return "deepspeed is not installed (`nox -s bench` installs it)"
    missing = baselines.aio_unavailable()
    if missing:
        return missing
    from bench.measured import runner

    try:
        runner._runner("zero-infinity-nvme")
    except KeyError:
        return "bench/measured/runner.py does not register zero-infinity-nvme (runner._runner)"
    return ""


@pytest.mark.slow
def test_cross_bench_nvme_zero_infinity_swapping_to_disk_trains_the_same_problem_as_cpu_offload():
    why = _nvme_runs_here()
    if why:
        pytest.skip(why)
    from bench.measured.runner import worker
    from bubbleless_runtime import spawn

    args = (SHAPE.as_dict(), SHAPE.steps, SHAPE.warmup, SHAPE.seq_len)
    cpu = spawn(worker, 2, "zero-infinity", *args, threads_per_process=1, timeout=SHAPE.timeout_s)
    nvme = spawn(worker, 2, "zero-infinity-nvme", *args, threads_per_process=1, timeout=SHAPE.timeout_s)
    assert nvme[0]["optimizer"] == "DeepSpeedCPUAdam"
    assert nvme[0]["losses"] == pytest.approx(cpu[0]["losses"], rel=1e-6)
    for rank, out in enumerate(nvme):
        swapped = out["swapped_files"]  # {directory under nvme_path: files}: parameters and optimizer state
        assert swapped.get(f"zero_stage_3/float32params/rank{rank}", 0) >= 2, swapped
        assert swapped.get(f"zero_stage_3/optimizer/rank{rank}", 0) >= 3, swapped  # fp32 weights, 2 moments
        assert not os.path.exists(out["nvme_path"]), f"{out['nvme_path']} was left behind"
