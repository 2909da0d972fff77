"""The built-in hardware profiles as data: every field a ``{"value": ..., "source": ...}`` pair.

This is exactly what ``hardware_to_dict`` writes and ``hardware_from_dict`` reads (the YAML format
``bubbleless-partition/hardware-v1``, ``hardware.save_hardware``), kept as Python literals so wheels
carry the built-ins and ``hardware(name)`` needs no YAML parser.

Conventions, written once:

- Bandwidths are GB/s (1e9 bytes/s) **per direction**. TFLOP/s are dense (no 2:4 sparsity); FP16/BF16
  tensor figures are with FP32 accumulate, as mixed-precision training runs them.
- ``sustained_tflops`` is our **assumption** of what large GEMMs of a transformer layer reach: 60% of
  peak on NVIDIA parts and 50% on MI300X (the fraction the existing analytic profiles used; typical of
  published MFU of 40-60% for training, where GEMMs run above the whole step's MFU). Measure when a device
  is at hand and replace it.
- ``host_bandwidth`` (achieved PCIe) is assumed 80% of the link's per-direction rate, the usual
  pinned-copy figure (``cudaMemcpyAsync`` from pinned memory, large transfers).
- The **host** (CPU, DRAM) of a GPU server is not part of the GPU's data sheet. Each profile names the
  server CPU it assumes (the usual one for that GPU's 8-GPU servers) and derives DRAM bandwidth from the
  memory channels (channels x MT/s x 8 bytes). ``cpu_adam_fused_params_per_s`` (DeepSpeed's vectorised
  CPU-Adam) is priced memory-bound: Adam over fp32 masters reads param, grad, m, v (16 bytes) and writes
  param, m, v and a 16-bit copy (14 bytes), 30 bytes per parameter, at an assumed 50% of peak DRAM
  bandwidth; our host optimizer (``bubbleless_offload.HostOptimizer``) runs torch's fused CPU AdamW, which
  the build VM measured at 1.2x DeepSpeedCPUAdam (``bench/results/cpu_adam.md``), so it is priced at this
  rate too. ``cpu_adam_params_per_s`` (``torch.optim.AdamW``'s default kernel on the CPU, what FSDP's CPU
  offload runs) is the fused rate over 4.0, an assumed ratio: torch's CPU AdamW makes about a
  dozen elementwise passes where the fused kernel makes one, and the ZeRO-Offload paper (Ren et al.,
  USENIX ATC 2021) reports its CPU-Adam several times faster than PyTorch's CPU Adam. The
  ``cpu`` profile measured on a machine (``bench/model.py --measure-cpu``) measures torch's directly: on
  the 2-core build VM (2026-12-01) AdamW ran at 105M params/s against a 17 GB/s copy, 162 bytes per
  parameter, 5.4x the fused 30: the assumed 4.0 is, if anything, kind to torch.
"""

from __future__ import annotations

ADAM_BYTES_PER_PARAM = 30
"""DRAM bytes one fused Adam update moves per parameter (see the module docstring)."""
ADAM_DRAM_SHARE = 0.5
"""Assumed fraction of peak DRAM bandwidth a fused CPU Adam reaches."""
TORCH_ADAM_SLOWDOWN = 4.0
"""Assumed: torch's CPU AdamW over the fused CPU-Adam's time (see the module docstring)."""

_ASSUMED_SUSTAINED_NVIDIA = (
    "assumed: 0.6 x peak, what large transformer GEMMs typically reach (not measured here)"
)
_ASSUMED_PCIE4 = "assumed: 80% of PCIe 4.0 x16's 31.5 GB/s per direction, a typical pinned-copy rate"
_ASSUMED_PCIE5 = "assumed: 80% of PCIe 5.0 x16's 63 GB/s per direction, a typical pinned-copy rate"


def _adam(host_gb_s: float) -> tuple[float, float]:
    fused = host_gb_s * 1e9 * ADAM_DRAM_SHARE / ADAM_BYTES_PER_PARAM
    return round(fused, -6), round(fused / TORCH_ADAM_SLOWDOWN, -6)


def _adam_fields(host_gb_s: float) -> dict:
    fused, torch_rate = _adam(host_gb_s)
    return {
        "cpu_adam_fused_params_per_s": {
            "value": fused,
            "source": f"assumed: memory-bound, {ADAM_DRAM_SHARE:g} x {host_gb_s:g} GB/s / "
                      f"{ADAM_BYTES_PER_PARAM} bytes per parameter (hardware_data docstring)",
        },
        "cpu_adam_params_per_s": {
            "value": torch_rate,
            "source": f"assumed: the fused rate / {TORCH_ADAM_SLOWDOWN:g} for torch.optim.AdamW on the CPU "
                      "(hardware_data docstring)",
        },
    }


def _sustained(peak: dict, fraction: float) -> dict:
    return {dtype: round(value * fraction, 3) for dtype, value in peak.items()}


_RTX4090_PEAK = {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6, "fp8": 330.3}
_A800_PEAK = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}
_MI300X_PEAK = {"bf16": 1307.4, "fp16": 1307.4, "tf32": 653.7, "fp32": 163.4, "fp8": 2614.9}
_H200_PEAK = {"bf16": 989.5, "fp16": 989.5, "tf32": 494.7, "fp32": 67.0, "fp8": 1978.9}

PROFILES: dict[str, dict] = {
    "rtx4090": {
        "name": "rtx4090",
        "kind": "gpu",
        "description": "NVIDIA GeForce RTX 4090 (AD102), in an 8-GPU PCIe server",
        "peak_tflops": {
            "value": _RTX4090_PEAK,
            "source": "NVIDIA Ada GPU Architecture whitepaper, appendix A, GeForce RTX 4090 column: 165.2 dense "
                      "FP16/BF16 tensor TFLOPS with FP32 accumulate, 82.6 TF32 tensor and FP32, 330.3 FP8 "
                      "with FP32 accumulate",
        },
        "sustained_tflops": {"value": _sustained(_RTX4090_PEAK, 0.6), "source": _ASSUMED_SUSTAINED_NVIDIA},
        "memory_gib": {"value": 24.0, "source": "Ada whitepaper appendix A: 24 GB GDDR6X"},
        "memory_bandwidth": {"value": 1008.0, "source": "Ada whitepaper appendix A: 1008 GB/s"},
        "pcie_bandwidth": {"value": 31.5, "source": "PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 per direction"},
        "host_bandwidth": {"value": 25.0, "source": _ASSUMED_PCIE4},
        "peer_to_peer": {
            "value": False,
            "source": "GeForce RTX 40 series has no NVLink and the driver disables PCIe peer-to-peer, so GPU to "
                      "GPU traffic is staged through host memory (RoundPipe section 1)",
        },
        "link_bandwidth": {
            "value": 25.0,
            "source": "assumed: no peer link, a device-to-device copy is staged through pinned host memory in "
                      "chunks (NCCL's SHM transport), so it runs at about the achieved PCIe rate",
        },
        "collective_bandwidth": {
            "value": 25.0,
            "source": "assumed: the same host-staged path; a ring collective's per-GPU bus traffic crosses "
                      "PCIe at the achieved rate",
        },
        "host_memory_bandwidth": {
            "value": 409.6,
            "source": "assumed server: 2x AMD EPYC 7003 (Milan), 8 channels DDR4-3200 each: 2 x 8 x 3200 MT/s "
                      "x 8 B (RoundPipe's paper does not fix the CPU; this is a common 8x 4090 chassis)",
        },
        **_adam_fields(409.6),
    },
    "a800": {
        "name": "a800",
        "kind": "gpu",
        "description": "NVIDIA A800 80GB SXM4 (A100-class with NVLink capped at 400 GB/s), HGX 8-GPU board",
        "peak_tflops": {
            "value": _A800_PEAK,
            "source": "NVIDIA A800 80GB data sheet (the A100 SXM4 figures): 312 dense BF16/FP16 tensor TFLOPS, "
                      "156 TF32, 19.5 FP32; no FP8",
        },
        "sustained_tflops": {"value": _sustained(_A800_PEAK, 0.6), "source": _ASSUMED_SUSTAINED_NVIDIA},
        "memory_gib": {"value": 80.0, "source": "A800 80GB data sheet: 80 GB HBM2e"},
        "memory_bandwidth": {"value": 2039.0, "source": "A800 80GB data sheet: 2,039 GB/s"},
        "pcie_bandwidth": {"value": 31.5, "source": "A800 data sheet: PCIe Gen4 x16; 31.5 GB/s per direction"},
        "host_bandwidth": {"value": 25.0, "source": _ASSUMED_PCIE4},
        "peer_to_peer": {"value": True, "source": "A800 data sheet: NVLink (third generation) over NVSwitch"},
        "link_bandwidth": {
            "value": 200.0,
            "source": "A800 data sheet: NVLink 400 GB/s (bidirectional, all links), so 200 per direction",
        },
        "collective_bandwidth": {
            "value": 200.0,
            "source": "the NVLink rate per direction: NVSwitch gives every GPU its whole NVLink bandwidth in a "
                      "ring collective",
        },
        "host_memory_bandwidth": {
            "value": 409.6,
            "source": "assumed server: 2x Intel Xeon Platinum 8380 (Ice Lake), 8 channels DDR4-3200 each, as in "
                      "NVIDIA's DGX/HGX A100-class reference builds",
        },
        **_adam_fields(409.6),
    },
    "mi300x": {
        "name": "mi300x",
        "kind": "gpu",
        "description": "AMD Instinct MI300X OAM, 8-GPU platform",
        "peak_tflops": {
            "value": _MI300X_PEAK,
            "source": "AMD Instinct MI300X data sheet: 1307.4 dense FP16/BF16 matrix TFLOPS, 653.7 TF32, "
                      "163.4 FP32 matrix, 2614.9 FP8",
        },
        "sustained_tflops": {
            "value": _sustained(_MI300X_PEAK, 0.5),
            "source": "assumed: 0.5 x peak (below NVIDIA's 0.6: published MI300X GEMM benchmarks reach a "
                      "smaller share of its larger peak); not measured here",
        },
        "memory_gib": {"value": 192.0, "source": "MI300X data sheet: 192 GB HBM3"},
        "memory_bandwidth": {"value": 5300.0, "source": "MI300X data sheet: 5.3 TB/s peak"},
        "pcie_bandwidth": {"value": 63.0, "source": "MI300X data sheet: PCIe Gen5 x16 (128 GB/s both ways)"},
        "host_bandwidth": {"value": 50.0, "source": _ASSUMED_PCIE5},
        "peer_to_peer": {"value": True, "source": "MI300X data sheet: Infinity Fabric links, fully connected 8 GPUs"},
        "link_bandwidth": {
            "value": 64.0,
            "source": "MI300X data sheet: 128 GB/s per Infinity Fabric link bidirectional, 64 per direction to "
                      "one peer",
        },
        "collective_bandwidth": {
            "value": 448.0,
            "source": "MI300X data sheet: 7 peer links x 64 GB/s per direction; a collective over all 8 GPUs uses "
                      "every link",
        },
        "host_memory_bandwidth": {
            "value": 921.6,
            "source": "assumed server: 2x AMD EPYC 9004 (Genoa), 12 channels DDR5-4800 each, AMD's MI300X "
                      "platform pairing",
        },
        **_adam_fields(921.6),
    },
    "h200": {
        "name": "h200",
        "kind": "gpu",
        "description": "NVIDIA H200 SXM 141GB, HGX 8-GPU board",
        "peak_tflops": {
            "value": _H200_PEAK,
            "source": "NVIDIA H200 data sheet (SXM column; its tensor figures are with sparsity, halved here for "
                      "dense): 989.5 BF16/FP16, 494.7 TF32, 1978.9 FP8; 67 FP32 (non-tensor)",
        },
        "sustained_tflops": {"value": _sustained(_H200_PEAK, 0.6), "source": _ASSUMED_SUSTAINED_NVIDIA},
        "memory_gib": {
            "value": 141.0,
            "source": "H200 data sheet: 141 GB HBM3e (nvidia-smi reports about 140 GiB usable)",
        },
        "memory_bandwidth": {"value": 4800.0, "source": "H200 data sheet: 4.8 TB/s"},
        "pcie_bandwidth": {"value": 63.0, "source": "H200 data sheet: PCIe Gen5 x16 (128 GB/s both ways)"},
        "host_bandwidth": {"value": 50.0, "source": _ASSUMED_PCIE5},
        "peer_to_peer": {"value": True, "source": "H200 data sheet: NVLink (fourth generation) over NVSwitch"},
        "link_bandwidth": {
            "value": 450.0,
            "source": "H200 data sheet: NVLink 900 GB/s (bidirectional), so 450 per direction",
        },
        "collective_bandwidth": {"value": 450.0, "source": "the NVLink rate per direction, over NVSwitch"},
        "host_memory_bandwidth": {
            "value": 614.4,
            "source": "assumed server: 2x Intel Xeon Platinum 8480+ (Sapphire Rapids), 8 channels DDR5-4800 "
                      "each, as in NVIDIA's HGX H100/H200 reference builds",
        },
        **_adam_fields(614.4),
    },
}
"""Built-in profiles by name, in the serialised form (without the ``format`` key)."""
