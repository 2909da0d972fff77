"""Back end 1 of the interpreter core: one process per rank, real autograd, real transfers.

This rank's lowered action list runs through ``interpreter.Interpreter`` with this module's handler
table (``INTERPRETER``): compute kinds (F, I, W, B) run autograd and return nothing; the communication
kinds (``COMM_KINDS``, batched) return the transfers they need, and the core posts the ones lowered
before a compute as one batch just before it. Receives of the next ``prefetch`` compute actions are
hoisted into that batch too, to overlap transfers with compute: that is a pure reordering of the list,
``execution_order``, computed once per executor, so the core only ever walks a list.

There are no schedule-specific branches: GPipe, 1F1B, interleaved, zero-bubble and V shapes differ
only in the order of the actions they hand over. Where a compute's input (or output gradient) comes
from is read from the schedule's layout, the ``requires`` events of the lowered schedule that the
simulator uses too (``("RECEIVED", RECV_F, s, m)``: a receive; ``("F", s-1, m)``: this rank's own
stage), once per action at construction; no handler asks which rank owns a neighbouring stage.
A new action kind is one handler: ``Pipeline(..., interpreter=INTERPRETER.with_handler(kind, fn))``.

State of one step lives in ``StepState`` (dropped at the end of the step); what outlives a step (the
stage modules, shape caches, the routes) lives on the ``Executor``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import torch

from bubbleless_schedules import Action, Kind
from bubbleless_schedules.action import COMM_KINDS
from bubbleless_schedules.layouts import is_lowered, layout_of

from .comm import Channel, Transfer, as_tuple, decode_meta, encode_meta, tag_of
from .interpreter import Interpreter
from .split_backward import WeightGradQueue, defer_weight_grads, run_weight_grads

NO_WAIT = 50e-6
"""Seconds under which a receive wait counts as work, not as blocked: waiting a transfer that has already
arrived takes about 10 us on gloo (measured), and gloo's ``is_completed`` does not tell us beforehand."""

EARLY_KINDS = frozenset({Kind.RECV_F, Kind.RECV_B})
"""The kinds ``execution_order`` may post ahead of their place (receives only: a send needs its tensor)."""

_ROUTED_KINDS = (Kind.F, Kind.I, Kind.B)
"""The computes whose data comes from another action; their ``requires`` events are kept per action."""


def execution_order(actions: Sequence[Action], prefetch: int, *, batched=COMM_KINDS) -> list[Action]:
    """``actions`` in the order their handlers run: each unbatched action after the batched ones lowered
    before it, and after the receives of the next ``prefetch`` unbatched actions (in lowered order, each
    once, skipping those already taken); the batched actions after the last unbatched one stay last.

    With ``prefetch=0`` this is ``actions`` itself. The core posts every run of batched actions as one
    batch, so a hoisted receive goes out together with the transfers of the compute it was hoisted above.
    """
    if prefetch < 0:
        raise ValueError(f"prefetch is a number of compute actions and cannot be negative, got {prefetch}")
    segments: list[tuple[list[int], int | None]] = []  # (positions of batched actions before it, its position)
    before: list[int] = []
    for position, action in enumerate(actions):
        if action.kind in batched:
            before.append(position)
        else:
            segments.append((before, position))
            before = []
    if before:
        segments.append((before, None))
    order, taken = [], set()
    for k, (before, at) in enumerate(segments):
        ahead = (p for later, _ in segments[k + 1:k + 1 + prefetch] for p in later if actions[p].kind in EARLY_KINDS)
        for p in chain(before, ahead):
            if p not in taken:
                taken.add(p)
                order.append(actions[p])
        if at is not None:
            order.append(actions[at])
    return order


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
    outputs: dict = field(default_factory=dict)  # stage outputs (or the loss on the last stage): events ("F", s, m)
    input_grads: dict = field(default_factory=dict)  # gradients w.r.t. a stage's input: events ("G", s, m)
    receives: dict = field(default_factory=dict)  # (kind, stage, mb) -> pending receive: ("RECEIVED", kind, s, m)
    meta_receives: dict = field(default_factory=dict)  # stage -> metadata transfer (first step only)
    queues: dict = field(default_factory=dict)  # deferred weight-gradient closures
    losses: dict = field(default_factory=dict)
    spans: list = field(default_factory=list)  # (action, start, end) of compute actions, see Executor.run
    blocked: float = 0.0  # seconds the current action spent waiting for a peer's transfer


@dataclass
class _PendingReceive:
    peer: int
    transfers: list[Transfer] | None  # None until the shapes are known (first step only)
    is_tuple: bool = False  # the sender's value was a tuple (gradients always travel as one)


class Executor:
    """Runs one rank's share of a lowered schedule with real autograd and real transfers.

    ``lowered``: the whole schedule with its sends and receives (``layouts.is_lowered``); this rank runs
    ``lowered.actions[rank]``. ``interpreter``: the handler table (default ``INTERPRETER``); every kind in
    this rank's list needs a handler there, checked here, before any step.
    """

    def __init__(self, *, rank, lowered, modules, loss_fn, channel: Channel | None,
                 on_stage_done: Callable[[int], None], prefetch: int = 0, interpreter: Interpreter | None = None):
        if not is_lowered(lowered):
            raise ValueError(f"{lowered.name or 'this schedule'} has no sends and receives yet (meta.comm=1): "
                             "lower it with bubbleless_schedules.add_communication first")
        self.rank = rank
        self.schedule = lowered
        # Placement, not routing: which rank a send goes to or a receive comes from (the peer of a
        # transfer the schedule already decided to make). Whether data travels at all is in ``routes``.
        self.owner = lowered.stage_to_rank
        self.last = lowered.num_stages - 1
        self.actions = lowered.actions[rank]
        self.modules = modules
        self.loss_fn = loss_fn
        self.channel = channel
        self.on_stage_done = on_stage_done
        self.interpreter = INTERPRETER if interpreter is None else interpreter
        self.interpreter.check(self.actions)
        layout = layout_of(lowered)
        self.routes = {a: layout.requires(a, lowered) for a in self.actions if a.kind in _ROUTED_KINDS}
        """Action -> the events it requires: where its input (F) or its output's gradient (I, B) comes from."""
        self.split = {(a.stage, a.microbatch) for a in self.actions if a.kind is Kind.I}
        self.backwards_per_stage = {
            s: sum(1 for a in self.actions if a.stage == s and a.kind in (Kind.W, Kind.B)) for s in modules
        }
        self.input_meta: dict = {}  # (signature, stage) -> (metas, is_tuple) of what the stage receives
        self.output_meta: dict = {}  # (signature, stage) -> metas of a stage's output tensors
        self.meta_sent: set = set()  # (signature, stage) whose metadata this rank has sent
        self.prefetch = prefetch
        self.order = execution_order(self.actions, prefetch, batched=self.interpreter.batched)

    # -- the loop: the interpreter core's ------------------------------------------------------------
    def run(self, state: StepState) -> None:
        """Run this rank's actions in ``execution_order``: each compute action after the transfers lowered
        before it (and the receives hoisted above it) are posted as one batch.

        The span recorded for a compute action ends when it returns and lasts as long as the rank worked
        on it since the previous action ended: posting the transfers before it, per-action bookkeeping and
        the compute, less the time blocked waiting for a peer's transfer (``state.blocked``, which
        ``_wait_receive`` adds to). Posting and bookkeeping are work this rank does, so only time blocked
        on a peer (and before the first, after the last action) counts as idle. That is the simulator's
        notion of a bubble, measured on the same spans that calibrate its costs (``trace.calibrated_costs``)."""
        self.remaining = dict(self.backwards_per_stage)
        self.interpreter.run(self, self.order, state)

    def post(self, batch: list[Transfer]) -> None:
        """The core hands over the transfers of consecutive communication actions here, as one batch."""
        self.channel.post(batch)

    def _tag(self, kind: str, stage: int, mb: int, index: int = 0) -> int:
        return tag_of(kind, stage, mb, index, self.schedule.num_stages, self.schedule.num_microbatches)

    # -- compute -----------------------------------------------------------------------------------
    def forward(self, action: Action, state: StepState) -> None:
        s, m = action.stage, action.microbatch
        activation = self._stage_input(action, state)
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
        _own_output, *downstream = self.routes[action]  # ("F", s, m): ``out``; then the gradient's source, if any
        if not downstream:  # ``out`` is the loss
            roots, grads = [out], [None]
        else:
            outs = [t for t in as_tuple(out) if _carries_grad(t)]
            pairs = [(o, g) for o, g in zip(outs, self._fetch(downstream[0], state), strict=True) if o.requires_grad]
            roots, grads = [o for o, _ in pairs], [g for _, g in pairs]
        if roots and roots[0].requires_grad:
            torch.autograd.backward(roots, grads)
        leaves = state.leaves.pop((s, m), None)
        if leaves is not None:  # the input came from another stage, which needs its gradient: event ("G", s, m)
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

    # -- activations and gradients between stages: routed by the layout's events -------------------
    def _stage_input(self, action: Action, state: StepState):
        needs = self.routes[action]
        if not needs:  # the first stage: the micro-batch itself
            return state.inputs[action.microbatch]
        activation, leaves = _as_leaves(self._fetch(needs[0], state))
        state.leaves[(action.stage, action.microbatch)] = leaves
        return activation

    def _fetch(self, event, state: StepState):
        """The value an event of the lowered schedule left on this rank: a stage's output ("F", kept for
        that stage's own backward), an input gradient ("G", handed on once), or a receive ("RECEIVED",
        waited for here), as its producer made it (a tensor, or a tuple)."""
        tag = event[0]
        if tag == "RECEIVED":
            tensors, is_tuple = self._wait_receive(event[1:], state)
            return tensors if is_tuple else tensors[0]
        if tag == "F":
            return state.outputs[event[1:]]
        if tag == "G":
            return state.input_grads.pop(event[1:])
        raise AssertionError(f"the multi-process executor has no data for event {event}")

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
            shapes, is_tuple = [(shape, dtype) for shape, dtype in known if dtype.is_floating_point or dtype.is_complex], True
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


# One handler per action kind: the whole back end. Plain functions rather than bound methods kept on
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

INTERPRETER = Interpreter(name="the multi-process executor", handlers=HANDLERS, batched=COMM_KINDS)
"""The default table of ``Executor`` and ``Pipeline``; ``INTERPRETER.with_handler(kind, fn)`` runs a new
kind (or wraps one) with ``fn(executor, action, state)``."""
