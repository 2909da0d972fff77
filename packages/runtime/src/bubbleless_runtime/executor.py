"""The interpreter: one handler per action kind, run over this rank's lowered action list.

There are no schedule-specific branches: GPipe, 1F1B, interleaved, zero-bubble and V shapes differ
only in the order of the actions they hand over. Compute kinds (F, I, W, B) run real autograd; the
communication kinds return the transfers they need, and consecutive ones are posted as one batch.

State of one step lives in ``StepState`` (dropped at the end of the step); what outlives a step (the
stage modules, shape caches) lives on the ``Executor``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

import torch

from bubbleless_schedules import Action, Kind
from bubbleless_schedules.action import COMM_KINDS

from .comm import Channel, Transfer, as_tuple, decode_meta, encode_meta, tag_of
from .split_backward import WeightGradQueue, defer_weight_grads, run_weight_grads

NO_WAIT = 50e-6
"""Seconds under which a receive wait counts as work, not as blocked: waiting a transfer that has already
arrived takes about 10 us on gloo (measured), and gloo's ``is_completed`` does not tell us beforehand."""


def _carries_grad(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _as_leaves(activation):
    """Detached copies-by-reference that start a new autograd graph for this stage."""
    tensors = as_tuple(activation)
    leaves = tuple(t.detach().requires_grad_(_carries_grad(t)) for t in tensors)
    return (leaves if isinstance(activation, (tuple, list)) else leaves[0]), leaves


@dataclass
class StepState:
    """Everything one step creates; keys are (stage, micro-batch)."""

    inputs: list
    targets: list
    signature: tuple
    device: torch.device | None = None
    leaves: dict = field(default_factory=dict)  # stage input tensors that collect input gradients
    outputs: dict = field(default_factory=dict)  # stage outputs (or the loss on the last stage)
    input_grads: dict = field(default_factory=dict)  # gradients w.r.t. a stage's input, to hand back
    receives: dict = field(default_factory=dict)  # (kind, stage, mb) -> pending receive
    meta_receives: dict = field(default_factory=dict)  # stage -> metadata transfer (first step only)
    queues: dict = field(default_factory=dict)  # deferred weight-gradient closures
    losses: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)  # (action, start, end) of compute actions, see Executor.run
    blocked: float = 0.0  # seconds the current action spent waiting for a peer's transfer


@dataclass
class _PendingReceive:
    peer: int
    transfers: list[Transfer] | None  # None until the shapes are known (first step only)
    is_tuple: bool = False


class Executor:
    """Runs one rank's share of a lowered schedule with real autograd and real transfers."""

    def __init__(self, *, rank, schedule, lowered_actions, modules, loss_fn, channel: Channel | None,
                 on_stage_done: Callable[[int], None], prefetch: int = 0):
        self.rank = rank
        self.schedule = schedule
        self.owner = schedule.stage_to_rank
        self.last = schedule.num_stages - 1
        self.actions = lowered_actions
        self.modules = modules
        self.loss_fn = loss_fn
        self.channel = channel
        self.on_stage_done = on_stage_done
        self.split = {(a.stage, a.microbatch) for a in lowered_actions if a.kind is Kind.I}
        self.backwards_per_stage = {
            s: sum(1 for a in lowered_actions if a.stage == s and a.kind in (Kind.W, Kind.B)) for s in modules
        }
        self.input_meta: dict = {}  # (signature, stage) -> (metas, is_tuple) of what the stage receives
        self.output_meta: dict = {}  # (signature, stage) -> metas of a stage's output tensors
        self.meta_sent: set = set()  # (signature, stage) whose metadata this rank has sent
        self.prefetch = prefetch
        self.segments = self._segments()

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, state: StepState) -> None:
        """Each compute action runs after the transfers lowered before it are posted; receives of the
        next ``prefetch`` compute actions are posted early too (in lowered order) to overlap transfers.

        The span recorded for a compute action ends when it returns and lasts as long as the rank worked
        on it since the previous action ended: posting the transfers before it, per-action bookkeeping and
        the compute, less the time blocked waiting for a peer's transfer. Posting and bookkeeping are
        work this rank does, so only time blocked on a peer (and before the first, after the last action)
        counts as idle. That is the simulator's notion of a bubble, measured on the same spans that
        calibrate its costs (``trace.calibrated_costs``)."""
        self.remaining = dict(self.backwards_per_stage)
        posted: set[int] = set()
        resumed = time.time()
        for k, (comms, action) in enumerate(self.segments):
            batch: list[Transfer] = []
            for position, comm in chain(comms, self._receives_ahead(k)):
                if position not in posted:
                    posted.add(position)
                    batch += HANDLERS[comm.kind](self, comm, state)
            self._post(batch)
            if action is None:
                continue
            state.blocked = 0.0
            HANDLERS[action.kind](self, action, state)
            end = time.time()
            state.spans.append((action, min(resumed + state.blocked, end), end))
            resumed = end

    def _segments(self) -> list:
        """[(comm actions before it with their positions, compute action)], trailing comms last (action None)."""
        segments, comms = [], []
        for position, action in enumerate(self.actions):
            if action.kind not in HANDLERS:
                raise ValueError(f"the multi-process executor cannot run {action} ({action.kind} actions)")
            if action.kind in COMM_KINDS:
                comms.append((position, action))
            else:
                segments.append((comms, action))
                comms = []
        if comms:
            segments.append((comms, None))
        return segments

    def _receives_ahead(self, k: int):
        for comms, _ in self.segments[k + 1:k + 1 + self.prefetch]:
            yield from ((position, c) for position, c in comms if c.kind in (Kind.RECV_F, Kind.RECV_B))

    def _post(self, batch: list[Transfer]) -> None:
        if batch:
            self.channel.post(batch)

    def _tag(self, kind: str, stage: int, mb: int, index: int = 0) -> int:
        return tag_of(kind, stage, mb, index, self.schedule.num_stages, self.schedule.num_microbatches)

    # -- compute -----------------------------------------------------------------------------------
    def forward(self, action: Action, state: StepState) -> None:
        s, m = action.stage, action.microbatch
        activation = self._stage_input(s, m, state)
        deferred = (s, m) in self.split
        queue: WeightGradQueue = state.queues.setdefault((s, m), []) if deferred else []
        with defer_weight_grads(queue) if deferred else _nothing():
            out = self.modules[s](activation)
            if s == self.last:
                out = self.loss_fn(out, state.targets[m])
                if not isinstance(out, torch.Tensor) or out.dim() != 0:
                    raise ValueError("loss_fn must return a scalar Tensor (sum or mean over the micro-batch)")
                state.losses[m] = out.detach()
        if s != self.last:
            self.output_meta.setdefault((state.signature, s), [(t.shape, t.dtype) for t in as_tuple(out)])
        state.outputs[(s, m)] = out

    def backward_input(self, action: Action, state: StepState) -> None:
        s, m = action.stage, action.microbatch
        out = state.outputs.pop((s, m))
        if s == self.last:
            roots, grads = [out], [None]
        else:
            outs = [t for t in as_tuple(out) if _carries_grad(t)]
            pairs = [(o, g) for o, g in zip(outs, self._output_grads(s, m, state), strict=True) if o.requires_grad]
            roots, grads = [o for o, _ in pairs], [g for _, g in pairs]
        if roots and roots[0].requires_grad:
            torch.autograd.backward(roots, grads)
        leaves = state.leaves.pop((s, m), ())
        if s > 0:
            state.input_grads[(s, m)] = tuple(
                leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves if _carries_grad(leaf)
            )

    def backward_weight(self, action: Action, state: StepState) -> None:
        run_weight_grads(state.queues.pop((action.stage, action.microbatch), []))
        self._stage_step_done(action.stage)

    def backward_full(self, action: Action, state: StepState) -> None:
        self.backward_input(action, state)
        self.backward_weight(action, state)

    def _stage_step_done(self, stage: int) -> None:
        self.remaining[stage] -= 1
        if self.remaining[stage] == 0:
            self.on_stage_done(stage)

    # -- activations and gradients between stages ----------------------------------------------------
    def _stage_input(self, s: int, m: int, state: StepState):
        if s == 0:
            return state.inputs[m]
        if self.owner[s - 1] == self.rank:
            activation, leaves = _as_leaves(state.outputs[(s - 1, m)])
        else:
            tensors, is_tuple = self._wait_receive((Kind.RECV_F, s, m), state)
            activation, leaves = _as_leaves(tensors if is_tuple else tensors[0])
        state.leaves[(s, m)] = leaves
        return activation

    def _output_grads(self, s: int, m: int, state: StepState) -> tuple:
        if self.owner[s + 1] == self.rank:
            return state.input_grads.pop((s + 1, m))
        return self._wait_receive((Kind.RECV_B, s, m), state)[0]

    def _wait_receive(self, key, state: StepState):
        waited_from = time.time()
        pending: _PendingReceive = state.receives.pop(key)
        if pending.transfers is None:  # first step with these shapes: learn them, then post
            kind, s, m = key
            if kind is Kind.RECV_F:
                self._learn_input_meta(s, state)
            pending = self._make_receive(kind, s, m, state)
            self.channel.post(pending.transfers)
        tensors = tuple(self.channel.wait(t) for t in pending.transfers)
        waited = time.time() - waited_from
        if waited > NO_WAIT:
            state.blocked += waited
        return tensors, pending.is_tuple

    def _learn_input_meta(self, s: int, state: StepState) -> None:
        key = (state.signature, s)
        if key not in self.input_meta and s in state.meta_receives:
            self.input_meta[key] = decode_meta(self.channel.wait(state.meta_receives.pop(s)))

    def _make_receive(self, kind: Kind, s: int, m: int, state: StepState) -> _PendingReceive:
        if kind is Kind.RECV_F:
            peer, known = self.owner[s - 1], self.input_meta.get((state.signature, s))
            if known is None:
                return _PendingReceive(peer, None)
            metas, is_tuple = known
            shapes = [(meta.shape, meta.dtype) for meta in metas]
            tag_kind, label = "F", f"the activation of stage {s - 1} micro-batch {m}"
        else:
            peer, known = self.owner[s + 1], self.output_meta.get((state.signature, s))
            if known is None:
                return _PendingReceive(peer, None)
            shapes, is_tuple = [(shape, dtype) for shape, dtype in known if dtype.is_floating_point or dtype.is_complex], False
            tag_kind, label = "B", f"the gradient of stage {s + 1} micro-batch {m}"
        device = state.device
        transfers = [
            Transfer(False, peer, torch.empty(shape, dtype=dtype, device=device), self._tag(tag_kind, s, m, i), label)
            for i, (shape, dtype) in enumerate(shapes)
        ]
        return _PendingReceive(peer, transfers, is_tuple)

    # -- communication handlers: each returns the transfers to post ---------------------------------
    def receive_forward(self, action: Action, state: StepState) -> list[Transfer]:
        return self._receive(Kind.RECV_F, action, state)

    def receive_backward(self, action: Action, state: StepState) -> list[Transfer]:
        return self._receive(Kind.RECV_B, action, state)

    def _receive(self, kind: Kind, action: Action, state: StepState) -> list[Transfer]:
        s, m = action.stage, action.microbatch
        pending = self._make_receive(kind, s, m, state)
        state.receives[(kind, s, m)] = pending
        if pending.transfers is not None:
            return pending.transfers
        if kind is Kind.RECV_F and s not in state.meta_receives:
            meta = Transfer(False, pending.peer, torch.empty(128, dtype=torch.int64), self._tag("META", s, 0),
                            f"the shapes of stage {s - 1}'s activation")
            state.meta_receives[s] = meta
            return [meta]
        return []

    def send_forward(self, action: Action, state: StepState) -> list[Transfer]:
        s, m = action.stage, action.microbatch
        out = state.outputs[(s, m)]
        tensors = tuple(t.detach().contiguous() for t in as_tuple(out))
        peer = self.owner[s + 1]
        transfers = []
        if (state.signature, s + 1) not in self.meta_sent:
            self.meta_sent.add((state.signature, s + 1))
            meta = encode_meta(tensors, isinstance(out, (tuple, list)))
            transfers.append(Transfer(True, peer, meta, self._tag("META", s + 1, 0), f"the shapes of stage {s}'s activation"))
        label = f"the activation of stage {s} micro-batch {m}"
        transfers += [Transfer(True, peer, t, self._tag("F", s + 1, m, i), label) for i, t in enumerate(tensors)]
        return transfers

    def send_backward(self, action: Action, state: StepState) -> list[Transfer]:
        s, m = action.stage, action.microbatch
        grads = state.input_grads.pop((s, m))
        label = f"the gradient of stage {s} micro-batch {m}"
        return [Transfer(True, self.owner[s - 1], g.contiguous(), self._tag("B", s - 1, m, i), label)
                for i, g in enumerate(grads)]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# One handler per action kind: the whole interpreter. Plain functions rather than bound methods kept on
# the instance, so an executor is in no reference cycle and goes (with the process groups its channel
# holds) as soon as its pipeline does.
HANDLERS = {
    Kind.F: Executor.forward,
    Kind.I: Executor.backward_input,
    Kind.W: Executor.backward_weight,
    Kind.B: Executor.backward_full,
    Kind.SEND_F: Executor.send_forward,
    Kind.RECV_F: Executor.receive_forward,
    Kind.SEND_B: Executor.send_backward,
    Kind.RECV_B: Executor.receive_backward,
}
