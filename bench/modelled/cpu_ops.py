"""What a large-GEMM rate leaves out at the calibration scenario's sizes, measured on this CPU: the rates
``common.profile_of`` prices a layer with when the hardware carries them (``CpuHardware``).

    python bench/model.py --measure-cpu   # writes bench/modelled/cpu.yaml and, beside it, cpu_ops.yaml

At bench/scenarios/tiny.yaml's sizes (256 tokens, width 256, MLP 768, 4 heads of 64, vocabulary 2,048,
fp32, 1 torch thread) a decoder layer's matrix multiplies are small, and what the analytic profile calls
small is not: attention at head width 64 runs far below the GEMM rate, and norms, the activation and the
residual adds are memory-bound passes that each pay torch's dispatch. Each rate below is timed on the op
the measured model runs (bench/measured/tiny.py), by the timing thread's CPU time (``time.thread_time``:
a core taken by another process costs no time, as the measured runs' run-queue wait is set apart;
bench/measured/common.py), median of many:

- ``gemm_tflops``: ``nn.Linear``'s three matrix multiplies (forward ``x W^T``, input gradient ``dY W``,
  weight gradient ``dY^T x``) over the layer's four projections (qkv, out, gate/up, down), FLOPs over time
  per pass;
- ``attention_tflops``: ``scaled_dot_product_attention(is_causal=True)`` forward and backward, against the
  analytic profile's attention FLOPs (``2 heads dim seq`` per token forward, twice that backward);
- ``elementwise_gb_s``: the layer's memory-bound ops (two LayerNorms, two residual adds, SiLU and the
  gating multiply) forward and backward, against ``ELEMENTWISE_BYTES`` (the bytes they read and write,
  counted below; backward counted as twice the forward);
- ``loss_gb_s``: ``cross_entropy`` over the vocabulary forward and backward, against the analytic
  profile's loss bytes (3 passes of 4-byte logits each way);
- ``op_overhead_s``: one autograd op's forward and backward on a one-element tensor (dispatch, the graph
  node, the engine), priced for the ops the rates above do not time (``OTHER_OPS_PER_LAYER``).

A GPU profile has none of them and is priced as before.

The same file's ``framework`` entry (``framework_ops``, written by ``python -m bench.modelled.framework_ops``
after ``--measure-cpu``, which rewrites the rest of the file without it) holds the data-parallel
frameworks' own host work per micro-batch and optimizer step, priced by the baselines' models; its
``split_backward`` entry (``split_ops``, ``python -m bench.modelled.split_ops``) what the runtime's backward
split costs, priced by the stage-bound model on the stages a schedule splits; its ``adamw`` entry
(``adam_ops``, ``python -m bench.modelled.adam_ops``) what ``torch.optim.AdamW``'s step costs over the
model's own tensors, priced as the pipelines' optimizer; its ``layout_backward`` entry (``layout_ops``,
``python -m bench.modelled.layout_ops``) the backward's copies into the fused q/k/v and gate/up layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bubbleless_partition import Hardware, load_hardware

from .adam_ops import AdamWRates, adamw_from_dict
from .cpu_profile import median_thread_seconds
from .framework_ops import FrameworkOps, framework_ops_from_dict
from .layout_ops import LayoutBackward, layout_backward_from_dict
from .split_ops import SplitBackward, split_backward_from_dict

FORMAT = "bubbleless-bench/cpu-ops-v1"
MEASURED_APART = ("framework", "split_backward", "adamw", "layout_backward")
"""Entries of the ops file measured by their own commands (``framework_ops``, ``split_ops``, ``adam_ops``,
``layout_ops``, each through ``ops_entry.write_ops_entry``), not small-op rates: ``--measure-cpu`` keeps
them as they were (``cpu_profile.write_cpu_profile``)."""


def elementwise_bytes_per_token(hidden: int, intermediate: int, dtype_bytes: int) -> float:
    """Bytes a pre-norm SwiGLU decoder layer's memory-bound forward ops read and write per token: two
    norms (read and write ``hidden``), two residual adds (read two, write one), SiLU over the gate (read
    and write ``intermediate``) and the gating multiply (read two, write one)."""
    return dtype_bytes * (2 * 2 * hidden + 2 * 3 * hidden + 2 * intermediate + 3 * intermediate)


NORM_BYTES_PER_TOKEN = 2
"""The final norm (the head's): read and write ``hidden`` values per token."""
BACKWARD_ELEMENTWISE = 2
"""Backward bytes counted per forward byte (each op reads its output's gradient and its saved input and
writes its input's gradient); the measured backward rate is against this count."""
ACCUMULATE_PASSES = 3
"""Passes over a parameter's bytes that accumulating a micro-batch's weight gradient into ``.grad`` makes
(``AccumulateGrad``'s ``add_``: read both, write one), in every micro-batch of a step but the first, which
takes the new gradient as ``.grad`` without a copy (every measured system zeroes with ``set_to_none``).
Profiled (torch.profiler, one tiny decoder layer forward and backward into held gradients): 10 ``add_``
a step, 0.53 ms, against 0.55 ms for its 0.85 M parameters' 3 x 4 bytes at the backward elementwise rate."""
OTHER_OPS_PER_LAYER = 24
"""Autograd ops of ``tiny.DecoderLayer`` the rates do not time, counted in its forward: the view, permute,
transpose and reshape around attention (4), ``chunk`` (1), the four ``Linear`` wrappers' transposes and
views (8), and the gradient accumulation of its 6 parameters, forward and backward together; each priced
at ``op_overhead_s``."""


@dataclass(frozen=True, kw_only=True)
class SmallOps:
    """Rates measured at one model's sizes (this module's docstring); ``sources`` says how each was."""

    gemm_tflops: tuple[float, float, float]
    """Forward, input-gradient and weight-gradient matrix multiplies."""
    attention_tflops: tuple[float, float]
    """Forward and backward of fused causal attention, against the analytic FLOP count."""
    elementwise_gb_s: tuple[float, float]
    """Forward and backward of norms, activation and residual adds, against ``elementwise_bytes_per_token``."""
    loss_gb_s: tuple[float, float]
    """Forward and backward of the cross-entropy, against the analytic loss bytes."""
    op_overhead_s: float
    """One autograd op, forward and backward, on a one-element tensor."""
    sources: dict = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        rates = (*self.gemm_tflops, *self.attention_tflops, *self.elementwise_gb_s, *self.loss_gb_s)
        if not all(isinstance(v, (int, float)) and v > 0 for v in rates) or not self.op_overhead_s >= 0:
            raise ValueError(f"SmallOps rates must be positive and op_overhead_s not negative, got {self!r}")


@dataclass(frozen=True, kw_only=True)
class CpuHardware(Hardware):
    """A measured CPU profile with its small-op rates (``common.profile_of`` prices layers with them)."""

    small_ops: SmallOps
    framework: FrameworkOps | None = None
    """The data-parallel frameworks' own host work (``framework_ops``, the ``framework`` entry of the
    ops file); None where it was not measured: the baselines' models then price it at zero, as on GPUs."""
    split_backward: SplitBackward | None = None
    """What the runtime's backward split costs (``split_ops``, the ``split_backward`` entry of the ops
    file); None where it was not measured: a split stage is then priced as an unsplit one, as on GPUs."""
    adamw: AdamWRates | None = None
    """``torch.optim.AdamW``'s default step over the measured model's tensors (``adam_ops``, the ``adamw``
    entry of the ops file), what the pipelines' optimizer is priced at; None where it was not measured: then
    priced as on GPUs (a fused step at memory bandwidth)."""
    layout_backward: LayoutBackward | None = None
    """The backward's copies into the fused projections' layout (``layout_ops``, the ``layout_backward``
    entry of the ops file), priced in each decoder layer's I; None where it was not measured: not priced."""


COLD_BYTES = 32 << 20
"""Each rate is timed over distinct copies of its tensors that add up to at least this (past the per-core
L2 cache), one after another: in a training step every layer's weights and saved tensors come back from
farther than the cache that a loop over one copy would keep them in."""


def _thread_seconds(make, repeats: int, cold_bytes: int) -> float:
    """Median thread CPU seconds of one call of ``make()``'s result, over copies of its tensors that hold
    ``cold_bytes`` together: ``make()`` builds fresh tensors and returns ``(call, bytes they hold)``."""
    calls, held = [], 0
    while held < cold_bytes or not calls:
        call, size = make()
        calls.append(call)
        held += size

    def sweep():
        for call in calls:
            call()

    return median_thread_seconds(sweep, repeats) / len(calls)


def measure_small_ops(*, tokens: int = 256, hidden: int = 256, intermediate: int = 768, heads: int = 4,
                      vocab: int = 2048, repeats: int = 15, cold_bytes: int = COLD_BYTES) -> SmallOps:
    """Time this module's ops at these sizes in fp32 on the calling thread (set torch's threads first)."""
    import torch

    from bubbleless_partition.analytic import LOGIT_BYTES, LOSS_PASSES

    def seconds(make) -> float:
        return _thread_seconds(make, repeats, cold_bytes)

    how = (f"thread CPU time, median of {repeats} sweeps over copies past {cold_bytes >> 20} MiB, fp32, "
           f"{torch.get_num_threads()} thread(s), {tokens} tokens, hidden {hidden}, MLP {intermediate}, "
           f"{heads} heads, vocabulary {vocab}")
    projections = [(hidden, 3 * hidden), (hidden, hidden), (hidden, 2 * intermediate), (intermediate, hidden)]
    gemm_flops = sum(2 * tokens * i * o for i, o in projections)
    gemm = tuple(
        _figures(gemm_flops / sum(seconds(lambda i=i, o=o, p=part: _gemm_call(torch, tokens, i, o, p))
                               for i, o in projections) / 1e12)
        for part in ("forward", "input_grad", "weight_grad"))
    dim = hidden // heads
    attention_flops = 2 * heads * dim * tokens * tokens  # analytic: 2 heads dim seq per token, seq = tokens
    attention = tuple(
        _figures(k * attention_flops / seconds(lambda p=part: _attention_call(torch, heads, tokens, dim, p)) / 1e12)
        for k, part in ((1, "forward"), (2, "backward")))
    layer_bytes = tokens * elementwise_bytes_per_token(hidden, intermediate, 4)
    elementwise = tuple(
        _figures(k * layer_bytes / seconds(lambda p=part: _elementwise_call(torch, tokens, hidden, intermediate, p)) / 1e9)
        for k, part in ((1, "forward"), (BACKWARD_ELEMENTWISE, "backward")))
    loss_bytes = tokens * vocab * LOGIT_BYTES * LOSS_PASSES
    loss = tuple(_figures(loss_bytes / seconds(lambda p=part: _loss_call(torch, tokens, vocab, p)) / 1e9)
                 for part in ("forward", "backward"))
    chain = 100
    overhead = seconds(lambda: _tiny_chain(torch, chain)) / chain
    return SmallOps(
        gemm_tflops=gemm, attention_tflops=attention, elementwise_gb_s=elementwise, loss_gb_s=loss,
        op_overhead_s=_figures(overhead),
        sources={
            "gemm_tflops": f"{how}: x W^T, dY W, dY^T x over the projections {projections} (in, out)",
            "attention_tflops": f"{how}: scaled_dot_product_attention(is_causal=True), (1, {heads}, {tokens}, {dim})",
            "elementwise_gb_s": f"{how}: 2 LayerNorm, 2 adds ({tokens}x{hidden}), SiLU and a multiply "
                                f"({tokens}x{intermediate}), autograd forward and backward",
            "loss_gb_s": f"{how}: cross_entropy(reduction='sum') over ({tokens}, {vocab}) fp32 logits",
            "op_overhead_s": f"{how}: a chain of {chain} multiplies of a 1-element tensor, forward and backward, per op",
        },
    )


def _figures(value: float) -> float:
    """Four significant figures (a rate's noise is larger)."""
    return float(f"{value:.4g}")


def _gemm_call(torch, tokens: int, inputs: int, outputs: int, orientation: str):
    x, w, dy = torch.randn(tokens, inputs), torch.randn(outputs, inputs), torch.randn(tokens, outputs)
    call = {"forward": lambda: x @ w.t(), "input_grad": lambda: dy @ w, "weight_grad": lambda: dy.t() @ x}
    return call[orientation], 4 * (x.numel() + w.numel() + dy.numel())


def _attention_call(torch, heads: int, tokens: int, dim: int, part: str):
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, heads, tokens, dim, requires_grad=True) for _ in range(3))
    size = 4 * 4 * q.numel()
    if part == "forward":
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), size
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    return (lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)), 2 * size


def _elementwise_call(torch, tokens: int, hidden: int, intermediate: int, part: str):
    """One decoder layer's norms, residual adds, SiLU and multiply, forward or backward."""
    import torch.nn.functional as F

    norm = torch.nn.LayerNorm(hidden)
    x, branch = (torch.randn(tokens, hidden, requires_grad=True) for _ in range(2))
    gate, up = (torch.randn(tokens, intermediate, requires_grad=True) for _ in range(2))
    size = 4 * tokens * (5 * hidden + 3 * intermediate)

    def ops():
        return [norm(x), norm(branch), x + branch, branch + x, F.silu(gate) * up]

    if part == "forward":
        return ops, size
    outs = ops()
    grads = [torch.randn_like(o) for o in outs]
    leaves = (x, branch, gate, up, *norm.parameters())
    return (lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)), 2 * size


def _loss_call(torch, tokens: int, vocab: int, part: str):
    import torch.nn.functional as F

    logits, targets = torch.randn(tokens, vocab, requires_grad=True), torch.randint(0, vocab, (tokens,))
    if part == "forward":
        return (lambda: F.cross_entropy(logits, targets, reduction="sum")), 4 * logits.numel()
    loss = F.cross_entropy(logits, targets, reduction="sum")
    return (lambda: torch.autograd.grad(loss, logits, retain_graph=True)), 8 * logits.numel()


def _tiny_chain(torch, chain: int):
    one = torch.ones(1, requires_grad=True)

    def call():
        y = one
        for _ in range(chain):
            y = y * 1.0
        y.backward()

    return call, 1 << 20  # nothing to keep cold: a few copies suffice


def small_ops_to_dict(ops: SmallOps) -> dict:
    data = {"format": FORMAT}
    for name in ("gemm_tflops", "attention_tflops", "elementwise_gb_s", "loss_gb_s", "op_overhead_s"):
        value = getattr(ops, name)
        data[name] = {"value": list(value) if isinstance(value, tuple) else value, "source": ops.sources.get(name, "")}
    return data


def small_ops_from_dict(data: dict) -> SmallOps:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a small-op profile: expected format {FORMAT!r}")
    fields_ = {k: v for k, v in data.items() if k not in ("format", *MEASURED_APART)}
    try:
        values = {k: tuple(v["value"]) if isinstance(v["value"], list) else v["value"] for k, v in fields_.items()}
        return SmallOps(**values, sources={k: v["source"] for k, v in fields_.items()})
    except (KeyError, TypeError) as error:
        raise ValueError(f"a small-op profile needs {{value, source}} for each rate: {error}") from error


def ops_path(hardware_path: str | Path) -> Path:
    """Where the small-op rates of the hardware file ``hardware_path`` live (``cpu.yaml`` -> ``cpu_ops.yaml``)."""
    path = Path(hardware_path)
    return path.with_name(f"{path.stem}_ops{path.suffix}")


def load_cpu_profile(path: str | Path) -> Hardware:
    """The hardware file at ``path``, with the small-op rates beside it when they are there."""
    import yaml

    hw = load_hardware(path)
    beside = ops_path(path)
    if not beside.exists():
        return hw
    data = yaml.safe_load(beside.read_text())
    framework = framework_ops_from_dict(data["framework"]) if "framework" in data else None
    split = split_backward_from_dict(data["split_backward"]) if "split_backward" in data else None
    adamw = adamw_from_dict(data["adamw"]) if "adamw" in data else None
    layout = layout_backward_from_dict(data["layout_backward"]) if "layout_backward" in data else None
    return with_small_ops(hw, small_ops_from_dict(data), framework=framework, split_backward=split, adamw=adamw,
                          layout_backward=layout)


def with_small_ops(hw: Hardware, ops: SmallOps, *, framework: FrameworkOps | None = None,
                   split_backward: SplitBackward | None = None, adamw: AdamWRates | None = None,
                   layout_backward: LayoutBackward | None = None) -> CpuHardware:
    values = {f: getattr(hw, f) for f in Hardware.__dataclass_fields__}
    return CpuHardware(**values, small_ops=ops, framework=framework, split_backward=split_backward, adamw=adamw,
                       layout_backward=layout_backward)
