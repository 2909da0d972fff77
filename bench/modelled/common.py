"""What every modelled system shares: the point it is asked about, what it answers, and the physics.

The physics here is the model's, not any system's: FLOP-priced layer costs (``analytic_profile``),
bytes of parameters, training state, activations and logits. Each system's module decides how it
moves, keeps and recomputes them; nothing in one system's model calls another's.

Assumptions written once (every system uses them):

- **Allocator headroom.** A device may fill ``1 - HEADROOM`` of its memory, less ``CONTEXT_BYTES`` for
  the CUDA/HIP context, NCCL buffers and library workspaces (assumed 1 GiB; PyTorch's caching allocator
  fragments, 10% is the usual margin).
- **Mixed precision.** ``bf16``/``fp16``: 16-bit working weights and gradients, fp32 master weights
  and Adam moments (12 bytes per parameter besides the 4 of weights and gradients), the ZeRO paper's
  accounting. ``fp32``: 4-byte weights and gradients, 8 bytes of moments.
- **LoRA** (``lora_rank``): adapters of that rank on every projection (q, k, v, o, gate, up, down;
  our runtime's defaults), attention-side only for MoE layers (experts are not adapted); the base is
  frozen: no weight gradients (W costs nothing), no gradients or optimizer state for it. The adapters'
  own FLOPs are left out (rank 16 adds under 1% to a layer's).
- **Logits.** A loss computed whole keeps, per token and vocabulary entry, the 16-bit logits, their
  fp32 copy and its fp32 gradient (10 bytes: what ``logits.float()`` then ``cross_entropy`` hold at the
  backward's peak in Hugging Face models); a chunked loss holds that for one chunk only.
- **Attention** is fused (flash): memory linear in the sequence, FLOPs quadratic.
- **Small ops.** A hardware profile that carries measured small-op rates (``cpu_ops.CpuHardware``: the
  ``cpu`` profile ``bench/model.py --measure-cpu`` writes) is priced with them (``small_op_profile``):
  each matrix multiply pass at its own measured rate, attention at its measured rate, and the norms,
  activation, residual adds, the loss and the untimed ops' dispatch that the analytic profile leaves out.
  Every other profile (every GPU) keeps the analytic profile's prices as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bubbleless_partition import Hardware, LayerCost, Profile, TransformerShape, analytic_profile
from bubbleless_partition.analytic import LOGIT_BYTES, LOSS_PASSES

from .cpu_ops import (
    ACCUMULATE_PASSES,
    BACKWARD_ELEMENTWISE,
    NORM_BYTES_PER_TOKEN,
    OTHER_OPS_PER_LAYER,
    CpuHardware,
    SmallOps,
    elementwise_bytes_per_token,
)
from .layout_ops import LayoutBackward, layout_bytes_per_token

HEADROOM = 0.10
"""Share of device memory left to the allocator (fragmentation, transient buffers)."""
CONTEXT_BYTES = 2**30
"""Device bytes no model owns: runtime context, communication buffers, library workspaces (assumed)."""
LOGITS_BYTES = 10
"""Bytes per (token, vocabulary entry) a loss holds at its peak (see the module docstring)."""
LOSS_CHUNK_TOKENS = 4096
"""Our runtime's chunked loss (``bubbleless_runtime.models.loss``) and RoundPipe's."""
LORA_TARGETS = 7
"""Projections a dense layer's LoRA adapts (q, k, v, o, gate, up, down)."""
MAX_SEQ = 1 << 22
"""The longest sequence the bisection tries (4M tokens)."""
PRECISIONS = {"bf16": 2, "fp16": 2, "fp32": 4}
"""Precision name -> bytes of a working weight or gradient."""


@dataclass(frozen=True, kw_only=True)
class Point:
    """One modelled run: a model on ``gpus`` devices of one kind, at one sequence length."""

    shape: TransformerShape
    hardware: Hardware
    gpus: int
    seq_len: int
    micro_batch: int = 1
    """Sequences per micro-batch."""
    global_batch: int = 32
    """Sequences per optimizer step, for every system (data-parallel systems split it over the GPUs)."""
    precision: str = "bf16"
    lora_rank: int | None = None
    """None: full fine-tuning; a rank: LoRA adapters on a frozen base."""

    def __post_init__(self) -> None:
        for name in ("gpus", "seq_len", "micro_batch", "global_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Point.{name} must be a positive int, got {value!r}")
        if self.global_batch % self.micro_batch:
            raise ValueError(f"global_batch={self.global_batch} is not a multiple of micro_batch={self.micro_batch}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {self.precision!r}")
        if self.lora_rank is not None and (not isinstance(self.lora_rank, int) or self.lora_rank < 1):
            raise ValueError(f"lora_rank must be a positive int or None, got {self.lora_rank!r}")

    @property
    def dtype_bytes(self) -> int:
        return PRECISIONS[self.precision]

    @property
    def microbatches(self) -> int:
        return self.global_batch // self.micro_batch

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch * self.seq_len

    def at(self, **changes) -> Point:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What a system's model says about a point. ``fits`` False: the run does not fit (tokens_per_s 0)."""

    system: str
    tokens_per_s: float
    step_s: float
    max_seq_len: int
    """The longest sequence (micro-batch 1) whose modelled peak fits the device; 0 if none does."""
    peak_device_bytes: float
    fits: bool = True
    notes: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)
    """Named parts of the step (seconds) and of the peak (bytes), for reports."""

    def as_dict(self) -> dict:
        return {
            "system": self.system, "tokens_per_s": self.tokens_per_s, "step_s": self.step_s,
            "max_seq_len": self.max_seq_len, "peak_device_bytes": self.peak_device_bytes, "fits": self.fits,
            "modelled": True, "notes": list(self.notes), "details": self.details,
        }


def usable_bytes(hw: Hardware) -> float:
    """Device bytes a model may fill: memory less headroom and the fixed context."""
    return hw.memory_bytes * (1 - HEADROOM) - CONTEXT_BYTES


@dataclass(frozen=True, kw_only=True)
class Accumulation:
    """How one rank of a system accumulates its micro-batches' weight gradients over a step (priced on a
    profile with measured small ops: ``small_op_profile``)."""

    microbatches: int
    """Micro-batches a rank runs each of its layers through in a step: all of the first takes its gradient as
    is, every later one adds into the buffer."""
    held_share: float
    """Share of a layer's parameter bytes the buffer it adds into holds: 1 for a full ``.grad``, 1 / GPUs for
    a shard (FSDP2 and ZeRO reduce-scatter every micro-batch and add into the rank's shard)."""

    def __post_init__(self) -> None:
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"Accumulation.microbatches must be a positive int, got {self.microbatches!r}")
        if not 0 < self.held_share <= 1:
            raise ValueError(f"Accumulation.held_share must be in (0, 1], got {self.held_share!r}")

    @property
    def adding_share(self) -> float:
        """Share of a rank's micro-batches that add into the buffer."""
        return (self.microbatches - 1) / self.microbatches


def pipeline_accumulation(point: Point) -> Accumulation:
    """A pipeline stage (ours, torch's ``Schedule1F1B``): every micro-batch of the step, into full ``.grad``."""
    return Accumulation(microbatches=point.microbatches, held_share=1.0)


def sharded_accumulation(point: Point) -> Accumulation:
    """A data-parallel rank of FSDP2 or ZeRO-2/3: its share of the micro-batches (``data_parallel_slices``,
    ``gradient_accumulation_steps``), each reduce-scattered and added into the rank's 1 / GPUs shard."""
    return Accumulation(microbatches=math.ceil(point.global_batch / (point.gpus * point.micro_batch)),
                        held_share=1.0 / point.gpus)


def profile_of(point: Point, *, loss_chunk_tokens: int | None, seq_len: int | None = None,
               accumulation: Accumulation | None = None) -> Profile:
    """Per-layer costs (ms per micro-batch) at the point's precision; LoRA zeroes the frozen base's W.
    ``accumulation``: the system's (default: a pipeline stage's), priced where the profile measures small ops."""
    hw = point.hardware.for_dtype(point.precision)
    prof = analytic_profile(point.shape, hw, seq_len=seq_len or point.seq_len, micro_batch_size=point.micro_batch,
                            dtype_bytes=point.dtype_bytes, loss_chunk_tokens=loss_chunk_tokens)
    if isinstance(hw, CpuHardware):
        prof = small_op_profile(prof, point, hw.small_ops, seq_len=seq_len or point.seq_len,
                                layout=hw.layout_backward,
                                accumulation=accumulation or pipeline_accumulation(point))
    if point.lora_rank is None:
        return prof
    return prof.with_(layers=tuple(replace(layer, weight_grad=0.0) for layer in prof.layers))


def accumulation_ms(layer: LayerCost, ops: SmallOps, accumulation: Accumulation) -> float:
    """Per-micro-batch price of adding ``layer``'s weight gradients into the buffer ``accumulation`` says:
    ``ACCUMULATE_PASSES`` over the bytes it holds at the backward elementwise rate, in its adding share."""
    bytes_per_ms = ops.elementwise_gb_s[1] * 1e6
    return accumulation.adding_share * ACCUMULATE_PASSES * layer.param_bytes * accumulation.held_share / bytes_per_ms


def small_op_profile(prof: Profile, point: Point, ops: SmallOps, *, seq_len: int,
                     layout: LayoutBackward | None = None, accumulation: Accumulation | None = None) -> Profile:
    """``prof`` with its decoder layers and LM head priced at the measured small-op rates (the module
    docstring; ``cpu_ops`` says how each rate is measured); the embedding keeps its memory-bound price.

    A decoder layer: F = its matrix multiplies at the forward GEMM rate + attention at the forward attention
    rate + its memory-bound bytes at the forward elementwise rate + half the untimed ops' overhead; I = the
    same at the backward rates (attention and elementwise backward counted twice the forward) + the other
    half; W = its matrix multiplies at the weight-gradient rate, plus accumulating its weight gradients
    (``accumulation_ms``: the system's ``accumulation``, a pipeline stage's by default); where ``layout``
    is measured (``layout_ops``), I also carries the copies of the q/k/v and gate/up gradients into the fused
    projections' layout at its rate. The head: its
    vocabulary projection at the three GEMM rates, the loss bytes (the analytic count) at the loss rates,
    its norm at the elementwise, and the same accumulation in W. The embedding keeps its analytic price
    and adds the same accumulation to its W (its dense gradient is added into its buffer as any other).
    """
    accumulation = accumulation or pipeline_accumulation(point)
    s, d = point.shape, point.dtype_bytes
    tokens = prof.tokens_per_microbatch
    (gf, gi, gw), (af, ab), (ef, eb), (lf, lb) = ((r * 1e9 for r in rates) for rates in (
        ops.gemm_tflops, ops.attention_tflops, (ops.elementwise_gb_s[0] / 1e3, ops.elementwise_gb_s[1] / 1e3),
        (ops.loss_gb_s[0] / 1e3, ops.loss_gb_s[1] / 1e3)))  # FLOPs or bytes per ms
    matmul = 2 * (s.attention_params() + s.mlp_params()[1]) * tokens
    attention = 2 * s.heads * s.dim * seq_len * tokens
    memory = tokens * elementwise_bytes_per_token(s.hidden, s.active_mlp_width(), d)
    dispatch = OTHER_OPS_PER_LAYER * ops.op_overhead_s * 1e3 / 2
    copies = 0.0 if layout is None else tokens * layout_bytes_per_token(s.hidden, s.active_mlp_width(), d) / (
        layout.gb_s * 1e6)  # bytes per ms

    def accumulate(layer) -> float:
        return accumulation_ms(layer, ops, accumulation)

    decoder = {"forward": matmul / gf + attention / af + memory / ef + dispatch,
               "input_grad": matmul / gi + 2 * attention / ab + BACKWARD_ELEMENTWISE * memory / eb + dispatch
               + copies,
               "weight_grad": matmul / gw + accumulate(prof.layers[1])}
    head_matmul = 2 * s.hidden * s.vocab * tokens
    loss = tokens * s.vocab * LOGIT_BYTES * LOSS_PASSES
    norm = tokens * NORM_BYTES_PER_TOKEN * s.hidden * d
    head = {"forward": head_matmul / gf + loss / lf + norm / ef,
            "input_grad": head_matmul / gi + loss / lb + BACKWARD_ELEMENTWISE * norm / eb,
            "weight_grad": head_matmul / gw + accumulate(prof.layers[-1])}
    if len(prof.layers) != s.num_layers + 2:
        raise ValueError(f"small-op pricing needs the head whole (one lm_head layer), got {len(prof.layers)} layers")
    embedding = prof.layers[0]
    priced = [replace(embedding, weight_grad=embedding.weight_grad + accumulate(embedding))]
    priced += [replace(layer, **decoder, recompute=decoder["forward"]) for layer in prof.layers[1:-1]]
    priced.append(replace(prof.layers[-1], **head, recompute=head["forward"]))
    return prof.with_(layers=tuple(priced))


def rank_optimizer_s(point: Point, prof: Profile, ranks) -> float | None:
    """Seconds of the slowest rank's ``torch.optim.AdamW`` step over its layers (``ranks``: each rank's layer
    indices in ``prof``) at the rates measured over the model's own tensors (``adam_ops``), where the
    profile carries them (a ``cpu`` profile); None elsewhere (every GPU: each system keeps its own price).
    LoRA: no step (the adapters' is a rounding error), as the GPU price."""
    rates = getattr(point.hardware, "adamw", None)
    if rates is None:
        return None
    if point.lora_rank is not None:
        return 0.0
    n = len(prof.layers)
    return max(sum(rates.layer_seconds(i, n, layer_params(prof.layers[i], point)) for i in r) for r in ranks)


def trainable_params(point: Point) -> float:
    """Parameters that get gradients and optimizer state."""
    s = point.shape
    if point.lora_rank is None:
        return s.parameter_count()
    q, kv = s.heads * s.dim, s.kv_heads * s.dim
    attention = (s.hidden + q) + 2 * (s.hidden + kv) + (q + s.hidden)
    mlp = 0 if s.experts is not None else 3 * (s.hidden + s.intermediate)
    return point.lora_rank * (attention + mlp) * s.num_layers


def state_bytes_per_trainable(point: Point) -> float:
    """Bytes of weights, gradients, master weights and Adam moments per trained parameter."""
    d = point.dtype_bytes
    return d + d + (12 if d == 2 else 8)


def layer_params(layer: LayerCost, point: Point) -> float:
    return layer.param_bytes / point.dtype_bytes


def logits_bytes(point: Point, tokens: int, chunk: int | None) -> float:
    """Peak bytes of the loss over ``tokens`` tokens, whole or in ``chunk``-token pieces."""
    held = tokens if chunk is None else min(chunk, tokens)
    return held * point.shape.vocab * LOGITS_BYTES


def decoder_activation_bytes(prof: Profile) -> float:
    """What one decoder layer keeps for backward over one micro-batch (all decoder layers are alike)."""
    return prof.layers[1].activation_bytes_per_token * prof.tokens_per_microbatch


def hidden_bytes(point: Point, tokens: int) -> float:
    """One hidden-state tensor (a layer's input or output) over ``tokens`` tokens."""
    return tokens * point.shape.hidden * point.dtype_bytes


def longest_sequence(peak_at, capacity: float, *, limit: int = MAX_SEQ) -> int:
    """The largest sequence length ``s`` in [1, limit] with ``peak_at(s) <= capacity`` (0 if none).

    Bisection; ``peak_at`` must not decrease with ``s`` (every system's peak model is a sum of terms
    linear or constant in the sequence), so a larger capacity never gives a shorter answer.
    """
    if peak_at(1) > capacity:
        return 0
    if peak_at(limit) <= capacity:
        return limit
    low, high = 1, limit  # peak_at(low) fits, peak_at(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if peak_at(mid) <= capacity:
            low = mid
        else:
            high = mid
    return low


def finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def not_fitting(system: str, point: Point, peak: float, max_seq: int, why: str, **details) -> Prediction:
    return Prediction(system=system, tokens_per_s=0.0, step_s=math.inf, max_seq_len=max_seq,
                      peak_device_bytes=peak, fits=False, notes=(why,), details=details)


def done(system: str, point: Point, step_s: float, peak: float, max_seq: int, notes, **details) -> Prediction:
    capacity = usable_bytes(point.hardware)
    if peak > capacity:
        return not_fitting(system, point, peak, max_seq,
                           f"needs {peak / 2**30:.1f} GiB per device at seq {point.seq_len}, "
                           f"{capacity / 2**30:.1f} GiB usable", **details)
    return Prediction(system=system, tokens_per_s=point.tokens / step_s, step_s=step_s, max_seq_len=max_seq,
                      peak_device_bytes=peak, notes=tuple(notes), details=details)
