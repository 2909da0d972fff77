"""Hardware profiles for analytic cost models: data, with where each number comes from.

The built-ins (``rtx4090``, ``a800``, ``mi300x``, ``h200``) live in ``hardware_data.PROFILES`` as
``{"value": ..., "source": ...}`` pairs: vendor data-sheet figures cited by document and column, and
assumptions marked ``assumed:`` with the reason (that module's docstring says which and why). A profile
saves to YAML and loads back (``save_hardware`` / ``load_hardware``, format
``bubbleless-partition/hardware-v1``); the built-ins need no YAML parser. Measure
(``bubbleless_partition.profile``) when the hardware is at hand.

``Hardware(...)`` built by hand still takes only the original fields (peak, efficiency, bandwidths,
memory, source); the fields added for the system cost models (per-dtype FLOP rates, PCIe, host DRAM,
CPU Adam) then default from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .hardware_data import PROFILES

FORMAT = "bubbleless-partition/hardware-v1"
"""Written at the top of every hardware file; loading refuses anything else."""

_SOURCED = (
    "peak_tflops", "sustained_tflops", "memory_gib", "memory_bandwidth", "pcie_bandwidth", "host_bandwidth",
    "peer_to_peer", "link_bandwidth", "collective_bandwidth", "host_memory_bandwidth",
    "cpu_adam_fused_params_per_s", "cpu_adam_params_per_s",
)
"""The fields a serialised profile gives as ``{"value": ..., "source": ...}``, in file order."""


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One accelerator (and the host it sits in) as the cost models see it."""

    name: str
    """Short key (``"rtx4090"``)."""
    peak_tflops: float
    """Dense BF16 tensor throughput, TFLOP/s (no sparsity)."""
    efficiency: float
    """Fraction of peak that the model's matrix multiplies reach (assumed): sustained / peak for BF16."""
    memory_bandwidth: float
    """Device memory bandwidth, GB/s: prices the memory-bound embedding gather and loss."""
    host_bandwidth: float
    """Host to device, GB/s per direction, achieved (assumed fraction of the PCIe link)."""
    link_bandwidth: float
    """Device to device, GB/s per direction between two pipeline neighbours."""
    memory_gib: float
    """Device memory, GiB."""
    source: str
    """Where the numbers come from (one line; ``sources`` has them field by field)."""
    kind: str = "gpu"
    """``"gpu"``, or ``"cpu"`` for a CPU measured as the device (calibration runs)."""
    description: str = ""
    """What the part is, in words."""
    peak_by_dtype: dict = field(default_factory=dict, hash=False)
    """Dense TFLOP/s per dtype (``"bf16"``, ``"fp16"``, ``"tf32"``, ``"fp32"``, ``"fp8"``); default: BF16 only."""
    sustained_by_dtype: dict = field(default_factory=dict, hash=False)
    """TFLOP/s large GEMMs reach per dtype; default: peak x efficiency."""
    pcie_bandwidth: float | None = None
    """The host link's rate per direction, GB/s (data sheet); default: ``host_bandwidth``."""
    peer_to_peer: bool = True
    """Whether devices reach each other directly (NVLink, Infinity Fabric, PCIe P2P) or through host memory."""
    collective_bandwidth: float | None = None
    """GB/s per direction one device gets in a ring collective over all devices; default: ``link_bandwidth``."""
    host_memory_bandwidth: float | None = None
    """The server's DRAM bandwidth, GB/s, all sockets (shared by every device's DMA and the CPU optimizer)."""
    cpu_adam_fused_params_per_s: float | None = None
    """Parameters a second a fused, vectorised CPU Adam (DeepSpeed's CPU-Adam) updates on the whole host."""
    cpu_adam_params_per_s: float | None = None
    """Parameters a second ``torch.optim.AdamW`` updates on the CPU (our host optimizer, FSDP's CPU offload)."""
    sources: dict = field(default_factory=dict, hash=False, compare=False)
    """Field name -> where its value comes from."""

    def __post_init__(self) -> None:
        for name in ("peak_tflops", "memory_bandwidth", "host_bandwidth", "link_bandwidth", "memory_gib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Hardware.{name} must be positive, got {getattr(self, name)!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"Hardware.efficiency is a fraction of peak in (0, 1], got {self.efficiency!r}")
        if self.kind not in ("gpu", "cpu"):
            raise ValueError(f"Hardware.kind must be 'gpu' or 'cpu', got {self.kind!r}")
        if not self.peak_by_dtype:
            object.__setattr__(self, "peak_by_dtype", {"bf16": self.peak_tflops})
        if not self.sustained_by_dtype:
            object.__setattr__(self, "sustained_by_dtype",
                               {k: v * self.efficiency for k, v in self.peak_by_dtype.items()})
        for name in ("peak_by_dtype", "sustained_by_dtype"):
            table = getattr(self, name)
            if not all(isinstance(v, (int, float)) and v > 0 for v in table.values()):
                raise ValueError(f"Hardware.{name} must map dtypes to positive TFLOP/s, got {table!r}")
        missing = set(self.peak_by_dtype) ^ set(self.sustained_by_dtype)
        if missing:
            raise ValueError(f"Hardware peak and sustained rates must name the same dtypes; differ in {sorted(missing)}")
        for name in ("pcie_bandwidth", "collective_bandwidth", "host_memory_bandwidth",
                     "cpu_adam_fused_params_per_s", "cpu_adam_params_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Hardware.{name} must be positive or None, got {value!r}")
        if self.pcie_bandwidth is None:
            object.__setattr__(self, "pcie_bandwidth", self.host_bandwidth)
        if self.collective_bandwidth is None:
            object.__setattr__(self, "collective_bandwidth", self.link_bandwidth)

    @property
    def flops_per_ms(self) -> float:
        return self.peak_tflops * 1e12 * self.efficiency / 1e3

    @property
    def bytes_per_ms(self) -> float:
        return self.memory_bandwidth * 1e6

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    def for_dtype(self, dtype: str) -> Hardware:
        """This profile with ``peak_tflops``/``efficiency`` at ``dtype``'s rates (what ``analytic_profile`` prices)."""
        if dtype not in self.peak_by_dtype:
            raise ValueError(f"{self.name} has no {dtype!r} rate; it lists {sorted(self.peak_by_dtype)}")
        peak, sustained = self.peak_by_dtype[dtype], self.sustained_by_dtype[dtype]
        return replace(self, peak_tflops=peak, efficiency=min(1.0, sustained / peak))


def hardware_from_dict(data: dict) -> Hardware:
    """A ``Hardware`` from the serialised form (``hardware_data.PROFILES`` entries, YAML files)."""
    if not isinstance(data, dict):
        raise ValueError(f"a hardware profile is a mapping, got {type(data).__name__}")
    if data.get("format", FORMAT) != FORMAT:
        raise ValueError(f"not a hardware profile: expected format {FORMAT!r}, found {data.get('format')!r}")
    known = set(_SOURCED) | {"format", "name", "kind", "description"}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown hardware fields {sorted(unknown)}; known: {sorted(known)}")
    values, sources = {}, {}
    for name in _SOURCED:
        entry = data.get(name)
        if entry is None:
            continue
        if not isinstance(entry, dict) or set(entry) != {"value", "source"}:
            raise ValueError(f"hardware field {name!r} must be {{value: ..., source: ...}}, got {entry!r}")
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            raise ValueError(f"hardware field {name!r} needs a non-empty source (say 'assumed: why' if it is one)")
        values[name], sources[name] = entry["value"], entry["source"]
    for name in ("peak_tflops", "sustained_tflops"):
        if not isinstance(values.get(name), dict) or "bf16" not in values[name]:
            raise ValueError(f"hardware field {name!r} must map dtypes to TFLOP/s and include 'bf16'")
    peak, sustained = dict(values.pop("peak_tflops")), dict(values.pop("sustained_tflops"))
    return Hardware(
        name=data["name"], kind=data.get("kind", "gpu"), description=data.get("description", ""),
        peak_tflops=peak["bf16"], efficiency=min(1.0, sustained["bf16"] / peak["bf16"]),
        peak_by_dtype=peak, sustained_by_dtype=sustained, sources=sources,
        source="; ".join(f"{k}: {v}" for k, v in sources.items()), **values,
    )


def hardware_to_dict(hw: Hardware) -> dict:
    """The serialised form: ``format``, identity, then every sourced field as ``{value, source}``."""
    values = {f.name: getattr(hw, f.name) for f in fields(Hardware)}
    values["peak_tflops"], values["sustained_tflops"] = dict(hw.peak_by_dtype), dict(hw.sustained_by_dtype)
    data = {"format": FORMAT, "name": hw.name, "kind": hw.kind, "description": hw.description}
    for name in _SOURCED:
        if values[name] is None:
            continue
        data[name] = {"value": values[name], "source": hw.sources.get(name) or hw.source}
    return data


def save_hardware(hw: Hardware, path: str | Path) -> Path:
    """Write ``hw`` as YAML (needs PyYAML)."""
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(hardware_to_dict(hw), sort_keys=False, width=110))
    return path


def load_hardware(path: str | Path) -> Hardware:
    """Read a YAML hardware file (needs PyYAML; the built-ins do not: ``hardware(name)``)."""
    import yaml

    return hardware_from_dict(yaml.safe_load(Path(path).read_text()))


HARDWARE = {name: hardware_from_dict(data) for name, data in PROFILES.items()}
"""The built-in profiles by name."""

RTX_4090 = HARDWARE["rtx4090"]
A800 = HARDWARE["a800"]
MI300X = HARDWARE["mi300x"]
H200 = HARDWARE["h200"]


def hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {sorted(HARDWARE)} (or build a Hardware(...), "
                         f"or load_hardware(path) for a YAML file)")
    return HARDWARE[name]
