"""Prefix sums over a profile, so the search algorithms price any contiguous range of layers in O(1).

The reported numbers in a ``Partition`` are recomputed layer by layer in ``partition.py``; these sums
only steer the searches (the tests check that the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from .layers import Profile


def _prefix(values) -> tuple[float, ...]:
    return (0.0, *accumulate(float(v) for v in values))


@dataclass(frozen=True)
class RangeCosts:
    """Sums of one per-layer quantity over ``[start, stop)`` plus the boundary transfer of each cut."""

    train: tuple[float, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    params: tuple[float, ...]
    memory: tuple[float, ...]
    transfer: tuple[float, ...]
    upload_ms_per_byte: float

    @classmethod
    def of(cls, profile: Profile) -> RangeCosts:
        layers = profile.layers
        n = len(layers)
        per_byte = 0.0 if profile.host_bandwidth is None else 1.0 / (profile.host_bandwidth * 1e6)
        return cls(
            train=_prefix(layer.train_time for layer in layers),
            forward=_prefix(layer.forward for layer in layers),
            backward=_prefix(layer.recompute + layer.input_grad + layer.weight_grad for layer in layers),
            params=_prefix(layer.param_bytes for layer in layers),
            memory=_prefix(profile.layer_memory(i) for i in range(n)),
            transfer=tuple(profile.cut_transfer_time(c) for c in range(n + 1)),
            upload_ms_per_byte=per_byte,
        )

    @property
    def n(self) -> int:
        return len(self.train) - 1

    @staticmethod
    def span(prefix: tuple[float, ...], start: int, stop: int) -> float:
        return prefix[stop] - prefix[start]

    def stage_time(self, start: int, stop: int) -> float:
        """Training time of a pipeline stage: F+I+W of its layers plus one send at each of its cuts."""
        return self.train[stop] - self.train[start] + self.transfer[start] + self.transfer[stop]

    def stage_memory(self, start: int, stop: int) -> float:
        return self.memory[stop] - self.memory[start]

    def upload(self, start: int, stop: int) -> float:
        return (self.params[stop] - self.params[start]) * self.upload_ms_per_byte
