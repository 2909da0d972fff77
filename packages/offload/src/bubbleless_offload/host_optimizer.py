"""``HostOptimizer``: the optimizer step on the CPU, over the store's fp32 masters.

Optimizer state (Adam's two moments: 8 bytes per parameter) is what fills a GPU first, so with the
weights it stays in host memory and the step runs there, with torch's own CPU kernels
(``torch.optim.AdamW``/``Adam``/``SGD``) so the arithmetic is a plain torch optimizer's. Adam and AdamW
use torch's fused CPU kernel (``fused=True``, torch >= 2.4) by default: on the build VM it stepped 4.7x
as many parameters per second as the default foreach kernel, equal to it within fp32 rounding
(bench/results/cpu_adam.md); ``fused=False`` keeps the foreach kernel. The parameter groups are built as
the runtime's ``build_optimizer`` builds them (matrices with weight decay first, then norms and biases
without), so the two can be compared step for step.

One ``step`` does, in order: unscale by the fp16 loss scaler (if any) and skip on inf/nan, clip by the
global L2 norm (``torch.nn.utils.clip_grad_norm_`` itself), step the torch optimizer, copy the masters
into the working weights (``HostStore.sync_working``) and zero the accumulators. The one-step-stale
variant that runs this on a thread while the next step computes is ``host_optimizer_async``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .host_store import HostStore
from .loss_scaler import DynamicLossScaler

__all__ = ["FUSED_CPU", "OPTIMIZERS", "HostOptimizer", "HostStepResult", "fused_cpu_available"]

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda groups, o: torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, **o.kernel),
    "adam": lambda groups, o: torch.optim.Adam(groups, lr=o.lr, betas=o.betas, eps=o.eps, **o.kernel),
    "sgd": lambda groups, o: torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum),
}
"""Optimizer name -> builder over ``(param groups, HostOptimizer)``; weight decay comes per group."""
FUSED_CPU = frozenset({"adam", "adamw"})
"""The names whose torch optimizer has a fused CPU kernel (torch >= 2.4), used unless ``fused=False``."""


def fused_cpu_available() -> bool:
    """Whether this torch has the fused CPU Adam/AdamW kernel (added in torch 2.4)."""
    return torch.torch_version.TorchVersion(torch.__version__) >= (2, 4)


@dataclass(frozen=True)
class HostStepResult:
    """What one ``HostOptimizer.step`` did."""

    grad_norm: float
    """Global L2 norm of the unscaled gradients before clipping; NaN when the step was skipped."""
    skipped: bool
    """True when the gradients held inf/nan: no weight changed (and the loss scaler backed off)."""


class HostOptimizer:
    """A torch CPU optimizer over ``store``'s fp32 masters, with clipping and fp16 loss scaling.

    ``name``: one of ``OPTIMIZERS``. ``lr``, ``betas``, ``eps``: Adam/AdamW's; ``momentum``: SGD's.
    ``fused``: torch's fused CPU kernel for Adam/AdamW (None: where this torch has it; False: the foreach
    kernel, bit-identical to a default ``torch.optim.AdamW``; True: required, a ValueError without it).
    ``weight_decay``: for parameters with ``dim() >= 2`` only. ``max_grad_norm``: clip the global norm
    to this (0: no clipping). ``loss_scaler``: the fp16 scaler whose scale multiplied the loss (None or
    disabled: gradients are taken as they are; a step with inf/nan gradients is skipped anyway, so a
    diverging run stops changing its weights instead of filling them with NaN). ``prepare_store``: called
    with ``store`` once every setting is checked, before the torch optimizer is built over its masters
    (``AsyncHostOptimizer`` passes ``HostStore.double_buffer``, which gives fp32 parameters masters of
    their own: a store changed only when the settings are good, and one optimizer over the final masters).
    """

    def __init__(
        self,
        store: HostStore,
        *,
        name: str = "adamw",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        max_grad_norm: float = 0.0,
        loss_scaler: DynamicLossScaler | None = None,
        fused: bool | None = None,
        prepare_store: Callable[[HostStore], object] | None = None,
    ) -> None:
        if name not in OPTIMIZERS:
            raise ValueError(f"optimizer name {name!r} is unknown; choose one of {sorted(OPTIMIZERS)}")
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
        for label, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay),
                             ("momentum", momentum), ("max_grad_norm", max_grad_norm)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{label} must be a finite number >= 0, got {value}")
        if not store.trainable:
            raise ValueError(
                "the store has no trainable parameters (all have requires_grad=False); "
                "unfreeze some (e.g. LoRA adapters) or run without an optimizer"
            )
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None (where available), True or False, got {fused!r}")
        if fused and name not in FUSED_CPU:
            raise ValueError(f"fused=True: {name!r} has no fused CPU kernel; use one of {sorted(FUSED_CPU)} or fused=None")
        if fused and not fused_cpu_available():
            raise ValueError(f"fused=True needs torch >= 2.4 (this is {torch.__version__}); pass fused=None or False")
        self.fused = name in FUSED_CPU and fused is not False and fused_cpu_available()
        """Whether the torch optimizer runs its fused CPU kernel."""
        self.kernel = {"fused": True} if self.fused else {}
        self.store, self.name, self.lr, self.betas, self.eps = store, name, lr, betas, eps
        self.weight_decay, self.momentum, self.max_grad_norm = weight_decay, momentum, max_grad_norm
        self.loss_scaler = loss_scaler
        if prepare_store is not None:
            prepare_store(store)
        masters = [hp.master for hp in store.trainable]
        groups = [
            {"params": [m for m in masters if m.dim() >= 2], "weight_decay": weight_decay},
            {"params": [m for m in masters if m.dim() < 2], "weight_decay": 0.0},
        ]
        self.torch_optimizer: torch.optim.Optimizer = OPTIMIZERS[name]([g for g in groups if g["params"]], self)
        """The inner torch optimizer (give it to an LR scheduler such as ``LambdaLR``)."""

    @property
    def param_groups(self) -> list[dict]:
        return self.torch_optimizer.param_groups

    def step(self) -> HostStepResult:
        """Apply the accumulated gradients: unscale, skip on inf/nan, clip, step, sync working weights, zero."""
        masters = self.store.masters_with_grads()
        result = self.update(masters, self.torch_optimizer)
        if not result.skipped:
            self.store.sync_working()
        self.store.zero_grad()
        return result

    def update(self, masters: list[torch.Tensor], torch_optimizer: torch.optim.Optimizer) -> HostStepResult:
        """Unscale, skip on inf/nan, clip and step ``torch_optimizer`` over ``masters`` (their ``.grad`` set):
        the masters change, nothing else (no working weights, no zeroing)."""
        grads = [m.grad for m in masters]
        overflow = False
        if self.loss_scaler is not None and self.loss_scaler.enabled:
            overflow = self.loss_scaler.unscale_(grads)
            self.loss_scaler.update(overflow)
        norm = math.nan
        if not overflow:
            if self.max_grad_norm > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(masters, self.max_grad_norm))
            else:
                norm = float(_total_norm(grads))
            overflow = not math.isfinite(norm)
        if overflow:
            return HostStepResult(grad_norm=math.nan, skipped=True)
        torch_optimizer.step()
        return HostStepResult(grad_norm=norm, skipped=False)

    def state_dict(self) -> dict:
        """The torch optimizer's state and the loss scaler's (None without one).

        The masters themselves are the store's: save ``store.master_state_dict()`` beside this."""
        scaler = self.loss_scaler.state_dict() if self.loss_scaler is not None else None
        return {"optimizer": self.torch_optimizer.state_dict(), "loss_scaler": scaler}

    def load_state_dict(self, state: dict) -> None:
        self.torch_optimizer.load_state_dict(state["optimizer"])
        if self.loss_scaler is not None and state.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(state["loss_scaler"])


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm as ``clip_grad_norm_`` computes it (the norm of the per-tensor norms)."""
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6: the very function clip_grad_norm_ uses
        return torch.nn.utils.get_total_norm(grads)
    if not grads:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0)
