"""What a cut is made from: one cost record per layer, and a profile that holds them in model order.

Times are milliseconds for one micro-batch; sizes are bytes. Nothing here knows about torch, so a
profile measured on a GPU box can be saved to YAML and cut anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

BYTES_PER_MS_PER_GB_S = 1e6
"""1 GB/s moves 1e9 bytes a second, that is 1e6 bytes a millisecond."""


def _check_non_negative(owner: str, **values: float | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{owner}.{name} must be a finite non-negative number (ms or bytes), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """Costs of one layer for one micro-batch, as measured or modelled."""

    name: str
    """A label for reports (``"embed"``, ``"layers.3"``, ``"lm_head"``)."""
    forward: float
    """F, ms: the forward pass that builds the autograd graph."""
    input_grad: float
    """I, ms: the gradient with respect to the layer's input (on the pipeline's critical path)."""
    weight_grad: float
    """W, ms: the gradient with respect to the layer's parameters (free to move into idle slots)."""
    recompute: float | None = None
    """R, ms: re-running the forward before backward (activation checkpointing, round-robin backward
    stages). None means the same as ``forward``."""
    param_bytes: float = 0
    """Bytes of the layer's parameters in the dtype they are trained in (what a weight upload moves)."""
    activation_bytes_per_token: float = 0
    """Bytes the layer keeps for its backward pass, per token of the micro-batch."""
    output_bytes_per_token: float = 0
    """Bytes of the layer's output per token: what crosses a stage boundary placed right after it."""

    def __post_init__(self) -> None:
        _check_non_negative(
            f"LayerCost({self.name!r})",
            forward=self.forward, input_grad=self.input_grad, weight_grad=self.weight_grad,
            recompute=self.recompute, param_bytes=self.param_bytes,
            activation_bytes_per_token=self.activation_bytes_per_token,
            output_bytes_per_token=self.output_bytes_per_token,
        )
        if self.recompute is None:
            object.__setattr__(self, "recompute", self.forward)

    @property
    def train_time(self) -> float:
        """F + I + W: one micro-batch's forward and whole backward through the layer."""
        return self.forward + self.input_grad + self.weight_grad


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Per-layer costs in model order, plus the few run facts that turn bytes into time and memory."""

    layers: tuple[LayerCost, ...]
    """One entry per layer, in the order the model runs them."""
    tokens_per_microbatch: int = 1
    """Tokens in one micro-batch (batch x sequence): scales the per-token activation bytes."""
    link_bandwidth: float | None = None
    """GB/s between two stages on different devices, for activation and gradient transfers at a cut.
    None means transfers are free (or fully overlapped)."""
    host_bandwidth: float | None = None
    """GB/s between host memory and one device (PCIe): how fast round-robin workers upload weights.
    None means uploads are free."""
    state_bytes_per_param_byte: float = 1.0
    """Device bytes of training state per parameter byte. 1 counts the weights only; bf16 weights with
    bf16 gradients and fp32 master weights and Adam moments on the device need 8."""
    microbatches_in_flight: int = 1
    """Micro-batches whose activations a stage holds at its peak (1F1B's first stage holds p)."""
    name: str = ""
    """What was profiled (model and shape)."""
    source: str = ""
    """How: ``"measured on cuda:0"``, ``"analytic: rtx4090"``."""
    extra: dict = field(default_factory=dict, compare=False)
    """Free-form notes carried to YAML and reports."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise ValueError("a Profile needs at least one layer")
        for layer in self.layers:
            if not isinstance(layer, LayerCost):
                raise ValueError(f"Profile.layers must hold LayerCost records, got {type(layer).__name__}")
        if not isinstance(self.tokens_per_microbatch, int) or self.tokens_per_microbatch < 1:
            raise ValueError(f"tokens_per_microbatch must be a positive int, got {self.tokens_per_microbatch!r}")
        if not isinstance(self.microbatches_in_flight, int) or self.microbatches_in_flight < 1:
            raise ValueError(f"microbatches_in_flight must be a positive int, got {self.microbatches_in_flight!r}")
        _check_non_negative("Profile", state_bytes_per_param_byte=self.state_bytes_per_param_byte)
        for name in ("link_bandwidth", "host_bandwidth"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"Profile.{name} must be a positive GB/s figure or None, got {value!r}")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_memory(self, index: int) -> float:
        """Device bytes layer ``index`` needs on the stage that holds it: training state plus activations."""
        layer = self.layers[index]
        return (
            layer.param_bytes * self.state_bytes_per_param_byte
            + layer.activation_bytes_per_token * self.tokens_per_microbatch * self.microbatches_in_flight
        )

    def cut_transfer_time(self, cut: int) -> float:
        """ms to send one micro-batch's tensor across a boundary placed before layer ``cut``.

        The activation goes forward and its gradient (same size) comes back; each side sends one, so a
        stage pays this once per boundary it has. Cuts at 0 and at the end move nothing.
        """
        if cut <= 0 or cut >= self.num_layers or self.link_bandwidth is None:
            return 0.0
        size = self.layers[cut - 1].output_bytes_per_token * self.tokens_per_microbatch
        return size / (self.link_bandwidth * BYTES_PER_MS_PER_GB_S)

    def upload_time(self, start: int, stop: int) -> float:
        """ms to upload the weights of layers ``[start, stop)`` from host memory to one device."""
        if self.host_bandwidth is None:
            return 0.0
        size = sum(layer.param_bytes for layer in self.layers[start:stop])
        return size / (self.host_bandwidth * BYTES_PER_MS_PER_GB_S)

    @property
    def total_train_time(self) -> float:
        return sum(layer.train_time for layer in self.layers)

    def with_(self, **changes) -> Profile:
        """A copy with some fields changed (``profile.with_(tokens_per_microbatch=8192)``)."""
        return replace(self, **changes)
