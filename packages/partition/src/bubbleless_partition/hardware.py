"""Hardware profiles for analytic cost models: data, with where each number comes from.

Peak figures are vendor data-sheet numbers (dense BF16 tensor throughput, memory bandwidth, link
bandwidth per direction). ``efficiency`` and the achieved host-link figures are our assumptions, not
measurements: large GEMMs on these parts typically reach 50-70% of peak, and pinned PCIe copies about 80%
of the link. Measure (``bubbleless_partition.profile``) when the hardware is at hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator as the analytic profile sees it."""

    name: str
    """Short key (``"rtx4090"``)."""
    peak_tflops: float
    """Dense BF16 tensor throughput, TFLOP/s (no sparsity)."""
    efficiency: float
    """Fraction of peak that the model's matrix multiplies reach (assumed)."""
    memory_bandwidth: float
    """Device memory bandwidth, GB/s: prices the memory-bound embedding gather and loss."""
    host_bandwidth: float
    """Host to device, GB/s per direction, achieved (assumed fraction of the PCIe link)."""
    link_bandwidth: float
    """Device to device, GB/s per direction between two pipeline neighbours."""
    memory_gib: float
    """Device memory, GiB."""
    source: str
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "memory_bandwidth", "host_bandwidth", "link_bandwidth", "memory_gib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Hardware.{name} must be positive, got {getattr(self, name)!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"Hardware.efficiency is a fraction of peak in (0, 1], got {self.efficiency!r}")

    @property
    def flops_per_ms(self) -> float:
        return self.peak_tflops * 1e12 * self.efficiency / 1e3

    @property
    def bytes_per_ms(self) -> float:
        return self.memory_bandwidth * 1e6


RTX_4090 = Hardware(
    name="rtx4090", peak_tflops=165.2, efficiency=0.6, memory_bandwidth=1008.0,
    host_bandwidth=25.0, link_bandwidth=25.0, memory_gib=24.0,
    source=(
        "NVIDIA Ada GPU architecture whitepaper, appendix A (RTX 4090: 165.2 dense FP16/BF16 tensor TFLOPS "
        "with FP32 accumulate, 1008 GB/s GDDR6X, 24 GB); PCIe 4.0 x16 is 32 GB/s per direction, 25 assumed "
        "achieved; no peer-to-peer, so neighbours talk through host memory at the same rate"
    ),
)

A800 = Hardware(
    name="a800", peak_tflops=312.0, efficiency=0.6, memory_bandwidth=2039.0,
    host_bandwidth=25.0, link_bandwidth=200.0, memory_gib=80.0,
    source=(
        "NVIDIA A800 80GB SXM data sheet (A100-class: 312 dense BF16 TFLOPS, 2039 GB/s HBM2e, 80 GB; "
        "NVLink 400 GB/s total, so 200 per direction); PCIe 4.0 x16, 25 GB/s assumed achieved"
    ),
)

MI300X = Hardware(
    name="mi300x", peak_tflops=1307.4, efficiency=0.5, memory_bandwidth=5300.0,
    host_bandwidth=50.0, link_bandwidth=64.0, memory_gib=192.0,
    source=(
        "AMD Instinct MI300X data sheet (1307.4 dense BF16 TFLOPS, 5.3 TB/s HBM3, 192 GB; Infinity Fabric "
        "128 GB/s per link bidirectional, 64 per direction to one peer; PCIe Gen5 x16 64 GB/s per "
        "direction, 50 assumed achieved); efficiency 0.5 assumed"
    ),
)

HARDWARE = {hw.name: hw for hw in (RTX_4090, A800, MI300X)}
"""The profiles by name."""


def hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)} (or build a Hardware(...))")
    return HARDWARE[name]
