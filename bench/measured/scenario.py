"""A measured scenario: model shape, systems, sequence, batch and micro-batches, read from YAML.

    name: tiny
    model: {layers: 4, hidden: 128, heads: 4, intermediate: 256, vocab: 1024}
    systems: [zbv, bubbleless-1f1b, 1f1b, roundrobin, zero-infinity, zero2, fsdp-offload, ddp]
    seq_len: 128
    ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

KNOWN_SYSTEMS = ("zbv", "zb", "bubbleless-1f1b", "1f1b", "roundrobin", "zero-infinity", "zero2", "fsdp-offload", "ddp",
                 "zbv-mem", "zero-infinity-nvme")
"""Measured systems; names match the modelled registry (``1f1b`` is torch's Schedule1F1B, ours is
``bubbleless-1f1b``), ``ddp`` is plain data parallel (torch DistributedDataParallel); ``zbv-mem`` is
zbv on the fastest measured cut at torch 1F1B's activation memory (``vcut``), not the even one;
``zero-infinity-nvme`` is ZeRO-Infinity swapping to disk (``baselines.nvme_offload``, needs libaio)."""


@dataclass(frozen=True, kw_only=True)
class TinyShape:
    """A small decoder-only transformer (embedding, ``layers`` decoder layers, norm + LM head)."""

    layers: int = 4
    """Decoder layers (the pipelines cut embedding + layers + head, ``layers + 2`` in all)."""
    hidden: int = 128
    """Model width."""
    heads: int = 4
    """Attention heads (causal, fused scaled-dot-product attention)."""
    intermediate: int = 256
    """MLP hidden width (SwiGLU)."""
    vocab: int = 1024
    """Vocabulary (embedding rows, logits per token)."""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """Everything one measured run needs; every system trains exactly this."""

    name: str
    """Names the results (``tiny`` -> bench/results/measured.md sections and JSON keys)."""
    model: TinyShape = field(default_factory=TinyShape)
    """The model every system trains."""
    systems: tuple[str, ...] = KNOWN_SYSTEMS
    """Which systems to run, in this order in the first round (later rounds rotate it)."""
    workers: int = 2
    """Ranks (stage-bound and data-parallel systems) or pool devices (round-robin); each gets
    ``threads`` torch threads."""
    threads: int = 1
    """torch threads per rank or pool device."""
    seq_len: int = 128
    """Tokens per sequence."""
    global_batch: int = 8
    """Sequences per optimizer step (every system; data-parallel ones split it over the workers)."""
    microbatches: int = 8
    """Micro-batches per step (pipelines) / micro-batches accumulated per step over all ranks (data parallel)."""
    steps: int = 6
    """Timed steps per round, after ``warmup``; the loss compared is the last step's."""
    warmup: int = 2
    """Untimed steps per round (first-step compilation, allocator warm-up)."""
    rounds: int = 2
    """Rounds: each runs every system once, fresh processes, the order rotated (systems alternate)."""
    lr: float = 1e-3
    """AdamW learning rate (betas (0.9, 0.999), eps 1e-8, no weight decay) for every system."""
    seed: int = 0
    """Seed of the initial weights and of the data."""
    loss_tolerance: float = 1e-3
    """Largest relative difference of the last step's loss from the first system's that counts as equal."""
    memory_budget_mib: float = 256.0
    """Longest-sequence search: the peak a probe may reach (see ``runner.peak_bytes``), MiB per process."""
    longest_low: int = 128
    """Longest-sequence search: the shortest sequence tried (must fit, else the answer is 0)."""
    longest_high: int = 16384
    """Longest-sequence search: the longest sequence tried."""
    longest_granularity: int = 128
    """Longest-sequence search stops when the bracket is this narrow (tokens)."""
    timeout_s: float = 900.0
    """One system run (or probe) taking longer fails."""
    zbv_mem_cut: tuple[int, ...] | None = None
    """zbv-mem's layers per stage; None: measured when the run starts (``vcut``: the fastest V cut whose
    ranks hold no more than torch 1F1B's busiest), then recorded here for every worker and the record."""

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in KNOWN_SYSTEMS]
        if unknown:
            raise ValueError(f"unknown measured systems {unknown}; choose from {', '.join(KNOWN_SYSTEMS)}")
        for name in ("workers", "threads", "seq_len", "global_batch", "microbatches", "steps", "rounds",
                     "longest_low", "longest_high", "longest_granularity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"scenario {name} must be a positive integer, got {value!r}")
        if self.longest_low > self.longest_high:
            raise ValueError(f"longest_low={self.longest_low} is above longest_high={self.longest_high}: the "
                             "longest-sequence search probes from the first up to the second; swap or lower them")
        if self.global_batch % self.microbatches:
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of microbatches={self.microbatches}")
        if self.microbatches % self.workers:
            raise ValueError(f"microbatches={self.microbatches} must be a multiple of workers={self.workers} "
                             "(data-parallel systems give each rank the same number)")
        if (self.model.layers + 2) % self.workers:
            raise ValueError(f"model.layers + 2 = {self.model.layers + 2} must be a multiple of workers={self.workers}: "
                             "torch's Schedule1F1B cuts the layers evenly, one stage per rank")
        if self.zbv_mem_cut is not None and (
                len(self.zbv_mem_cut) != 2 * self.workers or sum(self.zbv_mem_cut) != self.model.layers + 2
                or min(self.zbv_mem_cut) < 1):
            raise ValueError(f"zbv_mem_cut {list(self.zbv_mem_cut)} must give {2 * self.workers} stages (two per "
                             f"rank) of at least one layer, {self.model.layers + 2} layers in all; or leave it "
                             "out to have it measured")
        if self.model.hidden % self.model.heads:
            raise ValueError(f"model.hidden={self.model.hidden} must be a multiple of model.heads={self.model.heads}")

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch."""
        return self.global_batch // self.microbatches

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def as_dict(self) -> dict:
        data = asdict(self)
        data["systems"] = list(self.systems)
        if self.zbv_mem_cut is not None:  # YAML (the record's configuration) has lists, not tuples
            data["zbv_mem_cut"] = list(self.zbv_mem_cut)
        return data

    def with_(self, **changes) -> Scenario:
        data = {**{f.name: getattr(self, f.name) for f in fields(self)}, **changes}
        return Scenario(**data)


def scenario_from_dict(data: dict) -> Scenario:
    data = dict(data)
    names = {f.name for f in fields(Scenario)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown scenario keys {unknown}; known: {', '.join(sorted(names))}")
    model = data.pop("model", {}) or {}
    model_names = {f.name for f in fields(TinyShape)}
    if sorted(set(model) - model_names):
        raise ValueError(f"unknown model keys {sorted(set(model) - model_names)}; known: {', '.join(sorted(model_names))}")
    if "systems" in data:
        data["systems"] = tuple(data["systems"])
    if data.get("zbv_mem_cut") is not None:
        data["zbv_mem_cut"] = tuple(data["zbv_mem_cut"])
    return Scenario(model=TinyShape(**model), **data)


def load_scenario(path: str | Path) -> Scenario:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ValueError(f"no scenario file {path}; scenarios live in bench/scenarios/*.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    if "name" not in data:
        data["name"] = path.stem
    return scenario_from_dict(data)
