"""The Trainer: optimizer steps around ``Pipeline.step`` on every rank of a pipeline.

A step runs ``grad_accum`` pipeline steps, then, on every rank in lockstep: sums the gradients of
parameters held by several ranks (a tied embedding / LM head), unscales and checks fp16 gradients,
clips by the global norm over all ranks, and steps the optimizer and the learning-rate schedule.
Each rank's optimizer holds only the parameters of its own stages.

On the round-robin pool the optimizer is the pool's own host optimizer (``RoundRobinPipeline(optimizer=
...)``, ``bubbleless_offload.HostOptimizer`` or, one step stale, ``AsyncHostOptimizer``): the pool steps
it at the end of a step's last pipeline step (the earlier ones run with ``optimizer_step=False`` and add
into its host accumulators), and it unscales, clips (its ``max_grad_norm``) and steps the fp32 masters
itself; the Trainer drives its ``torch_optimizer``'s learning rate and reports its ``HostStepResult``.

Loss scaling lives in ``loss_scaling.py`` (``ScaledLoss`` is the ``loss_fn`` handed to the pipeline,
``DynamicLossScaler`` the fp16 scaler all ranks agree on) and checkpoint files in ``checkpoint.py``.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from bubbleless_offload import HostOptimizer
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer

from . import checkpoint
from .collectives import all_reduce, barrier, is_distributed
from .loss_scaling import DynamicLossScaler, ScaledLoss
from .signals import StopRequest, agreed_signal
from .train_overlap import overlapped_train_steps

__all__ = [
    "AUTOCAST_DTYPES", "OPTIMIZERS", "DynamicLossScaler", "ScaledLoss", "StepStats", "Trainer", "build_optimizer",
    "real_tokens", "seed_everything", "warmup_cosine",
]


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step did; every field but ``seconds`` is the same on every rank."""

    step: int
    """The trainer's step count after this step (1 for the first step of a fresh run)."""
    loss: float
    """Mean loss per micro-batch over the step's ``grad_accum`` pipeline steps, unscaled (taken from the
    rank holding the last stage and shared with every rank)."""
    grad_norm: float
    """Global L2 norm of the gradients over all ranks before clipping (each parameter counted once);
    NaN when the step was skipped. With the one-step-stale host optimizer (``optimizer.asynchronous``)
    the norm of the update applied during this step, the previous step's gradients' (NaN on a run's
    first step)."""
    lr: float
    """Learning rate the optimizer stepped with (the first parameter group's)."""
    tokens: int
    """Non-padding input tokens this rank fed to its pipeline steps (``real_tokens``: padding, segment
    id 0, is not counted; prompt tokens that carry no loss are). tokens/s everywhere is this over
    ``seconds``."""
    seconds: float
    """Wall-clock seconds of the whole optimizer step on this rank."""
    skipped: bool
    """True when fp16 gradients overflowed on some rank, so no rank stepped its optimizer or schedule
    (the pool's host optimizer: its update skipped on inf/nan gradients; one step late when asynchronous)."""
    stop_signal: int | None = None
    """The stop signal (SIGTERM, SIGINT) some rank had received by the end of this step, the same on every
    rank: the ``stop`` given to ``train_step`` rides on the step's loss all-reduce. None: no rank had one,
    or no ``stop`` was given."""


# precision name -> autocast dtype (None: no autocast)
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": lambda groups, c: torch.optim.AdamW(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps),
    "adam": lambda groups, c: torch.optim.Adam(groups, lr=c.lr, betas=tuple(c.betas), eps=c.eps),
    "sgd": lambda groups, c: torch.optim.SGD(groups, lr=c.lr, momentum=c.momentum),
}


def real_tokens(inputs) -> int:
    """Tokens of a batch that are not padding: of ``(input_ids, segments)`` (``data_batches.py``) those whose
    segment id is not 0 (a padded row's tail, a packed row's unfilled end); of a plain tensor (the
    synthetic tasks, which never pad) every element."""
    if isinstance(inputs, (tuple, list)):
        return int(torch.count_nonzero(inputs[1]))
    return inputs.numel()


def build_optimizer(params: Iterable[nn.Parameter], config) -> torch.optim.Optimizer:
    """The optimizer named by ``config.name``; weight decay on matrices only (not norms, biases)."""
    if config.name not in OPTIMIZERS:
        raise ValueError(f"optimizer.name {config.name!r} is unknown; choose one of {sorted(OPTIMIZERS)}")
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("this rank has no trainable parameters; check the partition and LoRA settings")
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return OPTIMIZERS[config.name]([g for g in groups if g["params"]], config)


def warmup_cosine(*, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear from 1/warmup to 1 over ``warmup_steps``, then cosine down to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators (every rank the same, so models build identically)."""
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Optimizer steps for one rank of a pipeline; call ``train_step`` on every rank in lockstep.

    ``layers``: the whole model's layer list as built on every rank (used to find parameters shared
    between ranks). ``loss``: the ``ScaledLoss`` given to the pipeline. ``group``: the pipeline's
    process group (None: the default group, or no group when torch.distributed is not initialised).
    ``max_grad_norm``: the global norm gradients are clipped to; 0 or None: no clipping (as 0 in Hugging
    Face's ``TrainingArguments``; the norm is measured and reported either way).
    ``autocast_device``: the device type bf16/fp16 autocast is entered for (None: the inputs' device).
    A ``RoundRobinPipeline`` is one rank holding every (host-resident) parameter; its inputs stay on the
    host while its devices compute, so give it the devices' type.
    ``optimizer``: a torch optimizer over ``pipeline.parameters()``' ``.grad``, or the pool's host optimizer
    ``pipeline.optimizer`` (module docstring; ``max_grad_norm`` is then its own, and an fp16 run's
    ``scaler`` must be its ``loss_scaler``). ``scaler``: the fp16 loss scaler (None: a new one).
    """

    def __init__(
        self,
        *,
        pipeline,
        layers: Sequence[nn.Module],
        loss: ScaledLoss,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        num_microbatches: int,
        grad_accum: int = 1,
        max_grad_norm: float | None = 0.0,
        precision: str = "fp32",
        group=None,
        autocast_device: str | None = None,
        scaler: DynamicLossScaler | None = None,
    ) -> None:
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision {precision!r} is unknown; choose one of {sorted(AUTOCAST_DTYPES)}")
        if grad_accum < 1 or num_microbatches < 1:
            raise ValueError("grad_accum and num_microbatches must be at least 1")
        self.pipeline, self.loss, self.optimizer, self.scheduler = pipeline, loss, optimizer, scheduler
        self.num_microbatches, self.grad_accum = num_microbatches, grad_accum
        self.max_grad_norm, self.precision, self.group = max_grad_norm, precision, group
        self.autocast_device = autocast_device
        self.params = [p for p in pipeline.parameters() if p.requires_grad]
        self.scaler = DynamicLossScaler(enabled=precision == "fp16") if scaler is None else scaler
        self.host = isinstance(optimizer, (HostOptimizer, AsyncHostOptimizer))
        """Whether ``optimizer`` is the pool's host optimizer, which the pool steps (else: a torch one here)."""
        if self.host:
            _check_host_optimizer(pipeline, optimizer, self.scaler)
        self._finish = self._finish_host_step if self.host else self._finish_rank_step
        self.drained = None
        """The ``HostStepResult`` of the update ``synchronize`` applied, for the next ``StepStats`` (kept in
        checkpoints, so a resumed run reports what the uninterrupted one does)."""
        self.step = 0
        self.data_position = 0
        self.shared, self.norm_owned = _shared_parameters(layers, self.params, group)
        self.replicas = getattr(pipeline, "replicas", None)
        """Data-parallel pools (``pool_replicas.ReplicaAverager``): the loss is their mean, the stop votes
        everyone's, and replica 0 alone writes checkpoints; None for one pool or a stage-bound pipeline."""

    def train_step(self, data, *, stop: StopRequest | None = None) -> StepStats:
        """Run ``grad_accum`` pipeline steps on ``data.batch(position)`` and one optimizer step.

        ``stop``: this rank's ``signals.StopRequest``, whose votes join the loss's all-reduce so that
        ``StepStats.stop_signal`` says on every rank whether any rank was signalled (give it on every
        rank of the group or on none: the all-reduce's length must agree)."""
        start = time.perf_counter()
        self.loss.factor = self.scaler.scale / (self.num_microbatches * self.grad_accum)
        summed, tokens = 0.0, 0
        lr = self.optimizer.param_groups[0]["lr"]
        for index in range(self.grad_accum):
            inputs, targets = data.batch(self.data_position)
            self.data_position += 1
            ids = inputs[0] if isinstance(inputs, (tuple, list)) else inputs  # (input_ids, segments) of real data
            tokens += real_tokens(inputs)
            with self._autocast(self.autocast_device or ids.device.type):
                loss = self.pipeline_step(inputs, targets, update=index == self.grad_accum - 1)
            if loss is not None:
                summed += float(loss)
        grad_norm, skipped = self._finish()
        if not skipped and self.scheduler is not None:  # a skipped step leaves the schedule where it was
            self.scheduler.step()
        self.step += 1
        mean_loss, stop_signal = self._loss_and_stop_everywhere(summed / self.scaler_scale_used(), stop)
        return StepStats(self.step, mean_loss, grad_norm, lr, tokens, time.perf_counter() - start, skipped,
                         stop_signal)

    @property
    def overlaps(self) -> bool:
        """Whether ``train_steps`` overlaps consecutive steps: the pool with the one-step-stale optimizer."""
        return isinstance(self.optimizer, AsyncHostOptimizer) and hasattr(self.pipeline, "steps")

    def train_steps(self, data, count: int, *, stop: StopRequest | None = None) -> Iterator[StepStats]:
        """Up to ``count`` optimizer steps, ``train_step`` each, ending early after the step whose stats carry
        a stop signal. On the pool with the one-step-stale optimizer the steps overlap (``train_overlap``:
        the same stats, ``seconds`` from one step's end to the next's); evaluate or save between calls."""
        if self.overlaps:
            yield from overlapped_train_steps(self, data, count, stop)
            return
        for _ in range(count):
            stats = self.train_step(data, stop=stop)
            yield stats
            if stats.stop_signal is not None:
                return

    def pipeline_step(self, inputs, targets, *, update: bool):
        """One pipeline step; ``update``: the pool's host optimizer steps at its end (else its gradients add
        up in the host accumulators). A torch optimizer is stepped by ``train_step`` instead."""
        if self.host:
            return self.pipeline.step(inputs, targets, optimizer_step=update)
        return self.pipeline.step(inputs, targets)

    def _finish_rank_step(self) -> tuple[float, bool]:
        """This rank's torch optimizer: sum shared gradients, unscale, clip over all ranks, step, zero."""
        self._sum_shared_gradients()
        skipped = self.scaler.unscale_and_check(self.params, self.group)
        grad_norm = math.nan if skipped else self._clip()
        if not skipped:  # a skipped fp16 step leaves the weights as they were
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def _finish_host_step(self) -> tuple[float, bool]:
        """The pool stepped its host optimizer: its latest update applied (synchronous: this step's;
        asynchronous: the previous step's, or the one ``synchronize`` applied; none on a first step)."""
        result = self.pipeline.last_step_result if self.drained is None else self.drained
        self.drained = None
        if result is None:
            return math.nan, False
        return result.grad_norm, result.skipped

    def synchronize(self) -> None:
        """Apply the host optimizer's update in flight (``optimizer.asynchronous``), so the weights are
        every step's so far: call before reading or saving them, and before an evaluation. The next step
        then runs on them, as after a synchronous step. A no-op otherwise."""
        if self.host and getattr(self.optimizer, "in_flight", False):
            self.drained = self.pipeline.synchronize()

    def discard_gradients(self) -> None:
        """Drop gradients that steps run only for their loss left (``data_eval`` on the pool)."""
        if self.host:
            self.pipeline.store.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def scaler_scale_used(self) -> float:
        """The loss scale that multiplied this step's losses (before ``unscale_and_check`` changed it)."""
        return self.loss.factor * self.num_microbatches * self.grad_accum

    def _autocast(self, device_type: str):
        dtype = AUTOCAST_DTYPES[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=dtype)

    def _sum_shared_gradients(self) -> None:
        """All-reduce (sum) the grads of parameters that several ranks hold, e.g. tied embeddings.

        Every rank joins the all-reduce (ranks not holding a parameter add zeros), so no extra process
        groups are needed; only holders write the sum back into ``.grad``.
        """
        if not self.shared:
            return
        held = {id(p) for p in self.params}
        parts = [p.grad if id(p) in held and p.grad is not None else torch.zeros_like(p) for p in self.shared]
        flat = torch.cat([part.flatten() for part in parts])
        all_reduce(flat, dist.ReduceOp.SUM, self.group)
        offset = 0
        for p in self.shared:
            if id(p) in held:
                p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _clip(self) -> float:
        """Global L2 norm over all ranks, each parameter counted once; scale grads down to max_grad_norm."""
        squares = torch.zeros((), dtype=torch.float64)
        for p in self.norm_owned:
            if p.grad is not None:
                squares += p.grad.detach().double().pow(2).sum().cpu()
        all_reduce(squares, dist.ReduceOp.SUM, self.group)
        norm = float(squares.sqrt())
        if self.max_grad_norm and norm > self.max_grad_norm:  # 0 or None: no clipping
            coef = self.max_grad_norm / (norm + 1e-6)
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def _loss_everywhere(self, local: float) -> float:
        """The loss from the rank holding the last stage, on every rank (``data_eval``'s loss too)."""
        return self._loss_and_stop_everywhere(local, None)[0]

    def _loss_and_stop_everywhere(self, local: float, stop: StopRequest | None) -> tuple[float, int | None]:
        """(the loss from the rank holding the last stage, the agreed stop signal), on every rank, from one
        all-reduce (SUM: the other ranks add 0.0 to the loss, and each its stop votes)."""
        votes = stop.votes() if stop is not None else []
        value = torch.tensor([local if self.pipeline.holds_loss else 0.0, *votes], dtype=torch.float64)
        all_reduce(value, dist.ReduceOp.SUM, self.group)
        if self.replicas is not None:  # each replica's loss on its own batch: report their mean
            all_reduce(value, dist.ReduceOp.SUM, self.replicas.group)
            value[0] /= self.replicas.size
        return float(value[0]), agreed_signal(value[1:].tolist()) if stop is not None else None

    # ---- checkpoints: one file per rank with everything this rank owns (see checkpoint.py) ----

    def state_dict(self) -> dict:
        """Everything this rank needs to resume exactly, including the stage sizes it was cut into."""
        return checkpoint.capture(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; ValueError when it was cut differently or holds other parameters. The
        optimizer's hyperparameters as built (lr, weight_decay, betas, ...) stay: ``checkpoint.restore``."""
        checkpoint.restore(self, state)

    def save(self, directory: str | os.PathLike, *, keep: int = 0) -> str:
        """Write checkpoint ``directory`` atomically, this rank's files and (rank 0) the manifest naming
        the schedule run; call on all ranks. ``keep``: then keep only the newest this many complete
        checkpoints beside it (0: all). Data-parallel pools: call on every replica; replica 0 writes (their
        states are the same) and each returns once the checkpoint is complete."""
        if self.replicas is None:
            return checkpoint.save(self.state_dict(), directory, self.group,
                                   schedule=getattr(self.pipeline, "schedule", None), keep=keep)
        try:
            if self.replicas.rank == 0:
                checkpoint.save(self.state_dict(), directory, self.group,
                                schedule=getattr(self.pipeline, "schedule", None), keep=keep)
        finally:  # a replica whose write failed still lets the others go on (they then find no checkpoint)
            barrier(self.replicas.group)
        return os.path.abspath(os.fspath(directory))

    def load(self, directory: str | os.PathLike) -> None:
        """Load this rank's files of a complete checkpoint written by ``save`` (checksums verified)."""
        self.load_state_dict(checkpoint.load(directory, self.group))


def _check_host_optimizer(pipeline, optimizer, scaler) -> None:
    if getattr(pipeline, "optimizer", None) is not optimizer:
        raise ValueError("a host optimizer given to the Trainer must be its pipeline's own (pipeline.optimizer)")
    host = optimizer.host if isinstance(optimizer, AsyncHostOptimizer) else optimizer
    if scaler.enabled and host.loss_scaler is not scaler:
        raise ValueError("fp16 with the pool's host optimizer: give the Trainer the scaler the host optimizer "
                         "unscales with (scaler=pipeline.optimizer.loss_scaler)")


def _shared_parameters(layers, params, group) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(params this rank shares with other ranks, params whose norm this rank counts).

    Every rank builds the whole model, so a parameter's position in the model is the same everywhere;
    ranks exchange which positions they train. A position trained by several ranks (a tied embedding
    and LM head on different stages) has its gradient summed across them, and its norm is counted by
    the lowest of them only.
    """
    positions: dict[int, int] = {}
    for layer in layers:
        for p in layer.parameters():
            positions.setdefault(id(p), len(positions))
    mine = sorted({positions[id(p)] for p in params if id(p) in positions})
    if not is_distributed(group):
        return [], list(params)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    me = dist.get_rank(group)
    owners: dict[int, list[int]] = {}
    for rank, held in enumerate(everyone):
        for position in held:
            owners.setdefault(position, []).append(rank)
    by_position = {positions[id(p)]: p for p in params if id(p) in positions}
    shared_positions = sorted(pos for pos, ranks in owners.items() if len(ranks) > 1)
    # every rank takes part in the all-reduce of every shared position, so each needs a tensor for it
    all_params = {pos: p for layer in layers for p in layer.parameters() for pos in [positions[id(p)]]}
    shared = [by_position.get(pos, all_params[pos]) for pos in shared_positions]
    counted = [p for pos, p in by_position.items() if owners[pos][0] == me]
    counted += [p for p in params if id(p) not in positions]
    return shared, counted
