"""The baselines, modelled from their published mechanisms (DeepSpeed and PyTorch documentation, the
ZeRO / ZeRO-Offload / ZeRO-Infinity papers, ``/work/shared/reference``), not from our planners.

Common to the three data-parallel systems (``zero-infinity``, ``zero2``, ``fsdp-offload``):

- every GPU runs the whole model on its share of the global batch: ``ceil(global / (GPUs x micro))``
  micro-batches of gradient accumulation per step;
- activation recompute is chosen per point, as a user would: off when the run fits without it, else
  per-layer checkpointing (each layer's input kept, one layer's activations rebuilt at a time);
- the loss is computed whole (Hugging Face ``ForCausalLM``): full logits, fp32 copy and gradient;
- transfers overlap compute perfectly, layer by layer (each layer costs the longer of its compute and its
  transfers): generous to every baseline, which in practice loses time to hooks and small transfers;
- a transfer's time is the largest of: host-link bytes over the achieved PCIe rate; collective bytes
  over the peer link (without peer links, as on the RTX 4090, collectives are staged through host memory
  and ride the same PCIe link); and the bytes every GPU moves through host DRAM together over half the
  host's DRAM bandwidth (staged collectives cross DRAM twice);
- ring collectives: an all-gather or reduce-scatter moves ``(G-1)/G`` of the tensor in and out of
  every GPU.

Per system:

- ``zero-infinity``: DeepSpeed ZeRO stage 3 with ``offload_param`` and ``offload_optimizer`` to pinned CPU
  memory. Each layer's 16-bit parameters live sharded in host memory: for forward, every GPU uploads its
  shard and all-gathers the layer; backward gathers again, reduce-scatters the gradients and offloads
  each GPU's shard of them (every micro-batch). The step: DeepSpeed's CPU-Adam over all parameters
  (``cpu_adam_fused_params_per_s``, every rank's process sharing one host), not overlapped. GPU memory:
  two gathered layers (the current and the prefetched), one layer's unreduced gradients, activations.
- ``zero2``: DeepSpeed ZeRO stage 2 with ``offload_optimizer`` (ZeRO-Offload): 16-bit parameters
  replicated on every GPU; gradients reduce-scattered during backward and offloaded every micro-batch
  (one 5e8-element reduce bucket on the GPU, DeepSpeed's default ``reduce_bucket_size``); CPU-Adam; then
  every GPU uploads its updated shard and all-gather rebuilds the replicas, not overlapped.
- ``fsdp-offload``: PyTorch FSDP2 ``fully_shard`` per decoder layer with ``CPUOffloadPolicy``: the same
  traffic as ZeRO-3 with parameters offloaded (``reshard_after_forward=True`` gathers again for
  backward), and the optimizer is ``torch.optim.AdamW`` stepping the CPU shards (``cpu_adam_params_per_s``).
Host work of the frameworks (ZeRO-3's module hooks and parameter coordinator, ZeRO-2's gradient hooks and
bucket copies, FSDP2's unit hooks, their flatten/partition copies and gloo collectives, the optimizer
step as each framework runs it): priced where the hardware profile measured it, the ``cpu`` profile's
``framework`` entry (``framework_ops``: per rank, a cost per unit of the framework's work and per
parameter byte, each micro-batch and at the optimizer boundary). On a CPU "device" it shares the cores
with the compute: it adds to each micro-batch and replaces the modelled optimizer and refresh at the
boundary (the measured boundary cost includes them). Every GPU profile leaves it at zero, as it was
before this term: on a GPU host this Python runs beside the device's compute and we have no cited
measurement of it there.

- ``1f1b``: ``torch.distributed.pipelining.Schedule1F1B``, one stage per GPU, weights, gradients and
  Adam state resident (16 bytes per parameter), no recompute, whole loss on the last stage. Given the
  same balanced cut as ours (``cut(method="dp")``: generous; a hand split is usually worse). Step time
  from the 1F1B closed form with unequal stages: ``sum_s t_s + (m - 1) max_s t_s`` (t_s: a stage's
  F + B + sends per micro-batch), plus the on-device optimizer (on a ``cpu`` profile, the slowest rank's
  ``torch.optim.AdamW`` at the rates ``adam_ops`` measures over the model's tensors). Stage s holds ``min(p - s, m)``
  micro-batches of activations at its peak (``reference/zero-bubble.md``).
"""

from __future__ import annotations

import math

from bubbleless_partition import cut

from .common import (
    Point,
    Prediction,
    decoder_activation_bytes,
    done,
    hidden_bytes,
    logits_bytes,
    longest_sequence,
    not_fitting,
    profile_of,
    rank_optimizer_s,
    sharded_accumulation,
    state_bytes_per_trainable,
    trainable_params,
    usable_bytes,
)
from .cpu_ops import CpuHardware
from .framework_ops import UNIT
from .registry import register

DRAM_SHARE = 0.5
"""Assumed share of the host's DRAM bandwidth that device copies get together."""
REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default ``reduce_bucket_size``."""
OPTIMIZER_BYTES_PER_PARAM = 30
"""Device bytes an on-GPU fused Adam step moves per parameter."""


def _accumulation(point: Point) -> int:
    return math.ceil(point.global_batch / (point.gpus * point.micro_batch))


def _transfer_s(point: Point, h2d: float, d2h: float, collective: float) -> float:
    """Seconds for one GPU's host copies and collective bytes while all GPUs do the same."""
    hw, g = point.hardware, point.gpus
    pcie = hw.host_bandwidth * 1e9
    if hw.peer_to_peer:
        link = max(max(h2d, d2h) / pcie, collective / (hw.collective_bandwidth * 1e9))
        dram_bytes = g * (h2d + d2h)
    else:
        link = (max(h2d, d2h) + collective) / pcie
        dram_bytes = g * (h2d + d2h + 2 * collective)
    dram = math.inf if hw.host_memory_bandwidth is None else hw.host_memory_bandwidth * 1e9 * DRAM_SHARE
    return max(link, dram_bytes / dram)


def _activation_bytes(point: Point, prof, recompute: bool) -> float:
    """Saved activations for one micro-batch through the whole model, whole loss included."""
    tokens = prof.tokens_per_microbatch
    decoder = decoder_activation_bytes(prof)
    layers = point.shape.num_layers
    kept = layers * hidden_bytes(point, tokens) + decoder if recompute else layers * decoder
    return kept + hidden_bytes(point, tokens) + logits_bytes(point, tokens, None)


def _grad_fraction(point: Point) -> float:
    """Gradient bytes per parameter byte that cross links: 1 for full fine-tuning, ~0 for LoRA."""
    return 1.0 if point.lora_rank is None else 0.0


def _sharded_microbatch_s(point: Point, prof, recompute: bool) -> tuple[float, float]:
    """(seconds, of which transfer-bound) for one micro-batch under ZeRO-3-style gathers."""
    g = point.gpus
    total = bound = 0.0
    for layer in prof.layers:
        size = layer.param_bytes
        gather = size * (g - 1) / g
        grads = size * _grad_fraction(point)
        forward = _transfer_s(point, size / g, 0.0, gather)
        backward = _transfer_s(point, size / g, grads / g, gather + grads * (g - 1) / g)
        compute_f = layer.forward / 1e3
        compute_b = ((layer.recompute if recompute else 0.0) + layer.input_grad + layer.weight_grad) / 1e3
        total += max(compute_f, forward) + max(compute_b, backward)
        bound += max(0.0, forward - compute_f) + max(0.0, backward - compute_b)
    return total, bound


def _sharded_peak(point: Point, seq_len: int, recompute: bool) -> float:
    prof = profile_of(point, loss_chunk_tokens=None, seq_len=seq_len)
    biggest = max(layer.param_bytes for layer in prof.layers)
    gathered = 2 * biggest + biggest * _grad_fraction(point)
    return gathered + _activation_bytes(point, prof, recompute)


FRAMEWORK_OF = {"zero-infinity": "zero3-offload", "zero2": "zero2-offload", "fsdp-offload": "fsdp2-offload"}
"""system -> the framework whose host work ``framework_ops`` measured for it."""


def framework_units(point: Point) -> dict[str, int]:
    """Units of each framework's fixed work (``framework_ops.UNIT``) in bench/measured/tiny.py's model, the
    one the calibration measures, counted as ``framework_ops.units_of`` counts the benchmark stack (a test
    checks this formula against the built model): the embedding (its wrapper and ``nn.Embedding``:
    2 modules, 1 tensor), each decoder layer (itself, 2 LayerNorm, 4 Linear: 7 modules; 8 tensors), the
    head (itself, LayerNorm, Linear: 3 modules, 3 tensors), and the ``nn.Sequential`` root (1 module, no
    tensor). bench/measured/baselines.py ``fully_shard``s every layer, the embedding and head included,
    then the root: layers + 3 units. A Hugging Face layer has more modules (separate q, k, v, norms per
    head); only CPU profiles price these units."""
    layers = point.shape.num_layers
    return {"module": 2 + 7 * layers + 3 + 1, "parameter tensor": 1 + 8 * layers + 3, "fully_shard unit": 1 + layers + 1 + 1}


def host_work_s(system: str, point: Point, prof) -> tuple[float, float] | None:
    """(seconds per micro-batch, seconds at the optimizer boundary) of ``system``'s framework work per rank
    on this hardware, or None where the profile has no measured figure (every GPU profile: zero, see the
    module docstring)."""
    hw = point.hardware
    if not isinstance(hw, CpuHardware) or hw.framework is None:
        return None
    framework = FRAMEWORK_OF[system]
    cost = hw.framework.costs[framework]
    units = framework_units(point)[UNIT[framework]]
    param_bytes = sum(layer.param_bytes for layer in prof.layers)
    return (units * cost.microbatch_unit_s + param_bytes * cost.microbatch_byte_s,
            units * cost.step_unit_s + param_bytes * cost.step_byte_s)


def _sharded(system: str, adam_field: str, label: str):
    def model(point: Point) -> Prediction:
        capacity = usable_bytes(point.hardware)
        recompute = _sharded_peak(point, point.seq_len, False) > capacity
        prof = profile_of(point, loss_chunk_tokens=None, accumulation=sharded_accumulation(point))
        per_mb, bound = _sharded_microbatch_s(point, prof, recompute)
        steps = _accumulation(point)
        optimizer = trainable_params(point) / getattr(point.hardware, adam_field)
        host_mb, boundary = host_work_s(system, point, prof) or (0.0, None)
        optimizer = optimizer if boundary is None else boundary  # measured: the boundary, its optimizer included
        step = steps * (per_mb + host_mb) + optimizer
        peak = _sharded_peak(point, point.seq_len, recompute)
        longest = longest_sequence(lambda s: _sharded_peak(point.at(micro_batch=1), s, True), capacity)
        notes = [f"{label}; recompute {'on' if recompute else 'off'}; {steps} micro-batches per GPU; "
                 f"{bound / per_mb:.0%} of a micro-batch waits on transfers"]
        return done(system, point, step, peak, longest, notes, compute_s=steps * (per_mb - bound),
                    transfer_wait_s=steps * bound, host_work_s=steps * host_mb, optimizer_s=optimizer)

    return model


zero_infinity = _sharded("zero-infinity", "cpu_adam_fused_params_per_s",
                         "ZeRO-3, params and optimizer offloaded to CPU, DeepSpeed CPU-Adam")
fsdp_offload = _sharded("fsdp-offload", "cpu_adam_params_per_s",
                        "FSDP2 CPUOffloadPolicy, torch AdamW on CPU shards")


def _zero2_peak(point: Point, seq_len: int, recompute: bool) -> float:
    prof = profile_of(point, loss_chunk_tokens=None, seq_len=seq_len)
    weights = sum(layer.param_bytes for layer in prof.layers)
    bucket = min(REDUCE_BUCKET_ELEMENTS * point.dtype_bytes, weights * _grad_fraction(point))
    return weights + bucket + _activation_bytes(point, prof, recompute)


def zero2(point: Point) -> Prediction:
    """DeepSpeed ZeRO-2 with the optimizer offloaded (see the module docstring)."""
    capacity = usable_bytes(point.hardware)
    recompute = _zero2_peak(point, point.seq_len, False) > capacity
    prof = profile_of(point, loss_chunk_tokens=None, accumulation=sharded_accumulation(point))
    g = point.gpus
    weights = sum(layer.param_bytes for layer in prof.layers)
    grads = weights * _grad_fraction(point)
    forward = sum(layer.forward for layer in prof.layers) / 1e3
    backward = sum((layer.recompute if recompute else 0.0) + layer.input_grad + layer.weight_grad
                   for layer in prof.layers) / 1e3
    offload = _transfer_s(point, 0.0, grads / g, grads * (g - 1) / g)
    per_mb = forward + max(backward, offload)
    steps = _accumulation(point)
    optimizer = trainable_params(point) / point.hardware.cpu_adam_fused_params_per_s
    refresh = _transfer_s(point, grads / g, 0.0, grads * (g - 1) / g)  # updated 16-bit shards back, all-gathered
    host_mb, boundary = host_work_s("zero2", point, prof) or (0.0, None)
    if boundary is not None:  # measured: the boundary, its optimizer and refresh included
        optimizer, refresh = boundary, 0.0
    step = steps * (per_mb + host_mb) + optimizer + refresh
    peak = _zero2_peak(point, point.seq_len, recompute)
    longest = longest_sequence(lambda s: _zero2_peak(point.at(micro_batch=1), s, True), capacity)
    notes = [f"ZeRO-2 + CPU-Adam; recompute {'on' if recompute else 'off'}; {steps} micro-batches per GPU"]
    return done("zero2", point, step, peak, longest, notes, compute_s=steps * (forward + backward),
                offload_wait_s=steps * max(0.0, offload - backward), host_work_s=steps * host_mb,
                optimizer_s=optimizer, refresh_s=refresh)


def _torch_1f1b_peak(point: Point, sizes, seq_len: int) -> float:
    prof = profile_of(point, loss_chunk_tokens=None, seq_len=seq_len)
    tokens = seq_len * point.micro_batch
    p, m = len(sizes), point.microbatches
    peaks, start = [], 0
    for stage, size in enumerate(sizes):
        layers = prof.layers[start:start + size]
        start += size
        weights = sum(layer.param_bytes for layer in layers)
        state = weights if point.lora_rank is not None else weights * state_bytes_per_trainable(point) / point.dtype_bytes
        in_flight = min(p - stage, m)
        if stage == p - 1:  # the whole loss: count the head's hidden input, and the logits once, as held
            body = sum(layer.activation_bytes_per_token for layer in layers[:-1]) * tokens + hidden_bytes(point, tokens)
            activations = in_flight * body + logits_bytes(point, tokens, None)
        else:
            activations = in_flight * sum(layer.activation_bytes_per_token for layer in layers) * tokens
        peaks.append(state + activations + 2 * hidden_bytes(point, tokens))
    return max(peaks)


def torch_1f1b(point: Point) -> Prediction:
    """``torch.distributed.pipelining.Schedule1F1B`` (see the module docstring)."""
    prof = profile_of(point, loss_chunk_tokens=None)
    p, m = point.gpus, point.microbatches
    if p > prof.num_layers:
        return not_fitting("1f1b", point, math.inf, 0, f"{p} stages are more than {prof.num_layers} layers")
    part = cut(prof, num_stages=p, method="dp")
    stage_ms = part.stage_costs
    makespan = (sum(stage_ms) + (m - 1) * max(stage_ms)) / 1e3
    measured = rank_optimizer_s(point, prof, [part.layers_of(s) for s in range(p)])  # a cpu profile
    optimizer = 0.0 if measured is None else measured
    if measured is None and point.lora_rank is None:
        params = max(sum(prof.layers[i].param_bytes for i in part.layers_of(s)) for s in range(p)) / point.dtype_bytes
        optimizer = params * OPTIMIZER_BYTES_PER_PARAM / (point.hardware.memory_bandwidth * 1e9)
    peak = _torch_1f1b_peak(point, part.sizes, point.seq_len)
    longest = longest_sequence(lambda s: _torch_1f1b_peak(point.at(micro_batch=1), part.sizes, s),
                               usable_bytes(point.hardware))
    notes = [f"torch Schedule1F1B, stages {list(part.sizes)} (our dp cut), weights resident, no recompute"]
    return done("1f1b", point, makespan + optimizer, peak, longest, notes, compute_s=makespan, optimizer_s=optimizer)


register("zero-infinity", modelled=zero_infinity, baseline=True,
         description="DeepSpeed ZeRO-3, params + optimizer offloaded to CPU (pinned)")
register("zero2", modelled=zero2, baseline=True, description="DeepSpeed ZeRO-2, optimizer offloaded to CPU")
register("fsdp-offload", modelled=fsdp_offload, baseline=True,
         description="PyTorch FSDP2 fully_shard with CPUOffloadPolicy")
register("1f1b", modelled=torch_1f1b, baseline=True,
         description="torch.distributed.pipelining Schedule1F1B, weights resident")
