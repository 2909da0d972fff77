"""Measure this machine's CPU as a ``Hardware`` profile named ``cpu``, for calibrating the models against
measured CPU runs (where every "device" is the CPU and every copy a memory copy).

    python bench/model.py --measure-cpu [--cpu-profile bench/modelled/cpu.yaml]

Measured with ``threads`` torch threads (default 1: what each measured rank or pool device runs,
bench/scenarios/tiny.yaml's ``threads``; recorded in the description), the thread count restored
after: GEMM throughput per dtype (``torch.mm`` of a (tokens x hidden) by (hidden x intermediate)
matrix at the tiny scenario's 256 tokens, width 256 and MLP width 768, median of a few runs: the
shapes the measured ranks multiply, not a large square GEMM that runs nearer the CPU's peak),
memory bandwidth (a large tensor copy, bytes read
plus written), the host-to-"device" copy rate (``bubbleless_runtime.pool_plan.copy_bandwidth`` on the
CPU, what the pool's LOAD costs here), and ``torch.optim.AdamW`` steps per second over one large fp32
tensor, with torch's default kernel and with its fused CPU kernel (what ``HostOptimizer`` runs; priced as
the profile's fused CPU-Adam). Not measured, and said so in the sources: peak FLOP/s (set to the
sustained figure).
Besides, the small-op rates of ``cpu_ops`` at the same sizes (the GEMM per pass, attention, norms and
adds, the loss, per-op dispatch), written beside the profile (``cpu_ops.yaml``) and priced by
``common.profile_of``. Every timing is the timing thread's CPU time, so a core taken by another process
costs nothing (the measured runs record that wait apart: bench/measured/common.py).
Some seconds on one core.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

from bubbleless_partition import Hardware, hardware_from_dict

DEFAULT_PATH = Path(__file__).with_name("cpu.yaml")


def median_thread_seconds(fn, repeats: int = 5) -> float:
    """Median thread CPU seconds of ``fn()`` (one untimed call first)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def measure_cpu(*, gemm: tuple[int, int, int] = (256, 256, 768), threads: int = 1, copy_mib: int = 256,
                adam_params: int = 1 << 23) -> Hardware:
    """``gemm``: (rows, inner, columns) of the timed ``torch.mm``; ``threads``: torch threads meanwhile."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _measure(torch, gemm, copy_mib, adam_params)
    finally:
        torch.set_num_threads(before)


def _measure(torch, gemm: tuple[int, int, int], copy_mib: int, adam_params: int) -> Hardware:
    from bubbleless_runtime.pool_plan import copy_bandwidth

    from .cpu_ops import measure_small_ops, with_small_ops

    rows, inner, columns = gemm
    tflops = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, columns, dtype=dtype)
        seconds = median_thread_seconds(lambda a=a, b=b: torch.mm(a, b), repeats=21)
        tflops[name] = round(2 * rows * inner * columns / seconds / 1e12, 4)
    source = torch.empty(copy_mib << 20, dtype=torch.uint8)
    target = torch.empty_like(source)
    memory_gb_s = round(2 * source.numel() / median_thread_seconds(lambda: target.copy_(source)) / 1e9, 2)
    host_gb_s = round(copy_bandwidth(torch.device("cpu")), 2)
    adam, fused = (_adam_rate(torch, adam_params, fused=f) for f in (False, True))
    ram_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    how = f"measured on {platform.node() or 'this machine'} with torch {torch.__version__}, {torch.get_num_threads()} threads"
    data = {
        "name": "cpu", "kind": "cpu",
        "description": f"{platform.processor() or platform.machine()}; {how}, {time.strftime('%Y-%m-%d')}",
        "peak_tflops": {"value": tflops, "source": "not measured: set to the sustained figure (efficiency 1)"},
        "sustained_tflops": {"value": tflops, "source": f"{how}: torch.mm ({rows}x{inner}) by ({inner}x{columns}), median of 21"},
        "memory_gib": {"value": ram_gib, "source": "physical memory (sysconf)"},
        "memory_bandwidth": {"value": memory_gb_s, "source": f"{how}: {copy_mib} MiB copy, read + write bytes"},
        "pcie_bandwidth": {"value": host_gb_s, "source": "no host link: a CPU device's copy is a memory copy"},
        "host_bandwidth": {"value": host_gb_s, "source": f"{how}: pool_plan.copy_bandwidth(cpu), 16 MiB"},
        "peer_to_peer": {"value": False, "source": "CPU devices hand activations through host memory"},
        "link_bandwidth": {"value": host_gb_s, "source": "as host_bandwidth: a memory copy"},
        "collective_bandwidth": {"value": host_gb_s, "source": "as host_bandwidth: gloo over shared memory, assumed"},
        "host_memory_bandwidth": {"value": memory_gb_s, "source": "as memory_bandwidth"},
        "cpu_adam_fused_params_per_s": {
            "value": fused, "source": f"{how}: torch.optim.AdamW(fused=True).step over {adam_params} fp32 "
                                      "parameters, median of 3 (what HostOptimizer runs)"},
        "cpu_adam_params_per_s": {
            "value": adam, "source": f"{how}: torch.optim.AdamW.step (default foreach kernel) over {adam_params} "
                                     "fp32 parameters, median of 3"},
    }
    return with_small_ops(hardware_from_dict(data), measure_small_ops(tokens=rows, hidden=inner, intermediate=columns))


def _adam_rate(torch, adam_params: int, *, fused: bool) -> float:
    """Parameters per second of one ``AdamW.step`` over one large fp32 tensor (torch's fused CPU kernel where
    ``fused`` and torch has one, else its default kernel)."""
    param = torch.nn.Parameter(torch.zeros(adam_params))
    param.grad = torch.randn(adam_params)
    try:
        optimizer = torch.optim.AdamW([param], lr=1e-3, fused=fused or None)
    except (RuntimeError, TypeError):  # a torch without the fused CPU kernel
        optimizer = torch.optim.AdamW([param], lr=1e-3)
    return round(adam_params / median_thread_seconds(optimizer.step, repeats=3), -3)




def write_cpu_profile(path: str | Path = DEFAULT_PATH) -> Hardware:
    """Measure, then write the profile at ``path`` and its small-op rates beside it (``cpu_ops.ops_path``)."""
    import yaml

    from bubbleless_partition import save_hardware

    from .cpu_ops import MEASURED_APART, ops_path, small_ops_to_dict

    hw = measure_cpu()
    save_hardware(hw, path)
    beside = ops_path(path)
    data = small_ops_to_dict(hw.small_ops)
    previous = yaml.safe_load(beside.read_text()) if beside.exists() else None
    for entry in MEASURED_APART:  # measured by their own commands: kept
        if isinstance(previous, dict) and entry in previous:
            data[entry] = previous[entry]
    beside.write_text(yaml.safe_dump(data, sort_keys=False, width=110))
    return hw
