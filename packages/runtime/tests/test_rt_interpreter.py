"""The interpreter core and the multi-process executor as its back end.

- The core calls the back end's handler of each action in order, posts what batched kinds return as one
  batch before the next unbatched action (and at the end), and records one span per unbatched action
  that starts where the previous ended plus the time the handler reported blocked.
- ``execution_order`` is the old run loop's posting order as a pure function: literal before/after text.
- The executor's table is injectable: a wrapped F and a kind it does not run by default both work, and
  gradients still equal the unpipelined model's; data routes come from the layout's ``requires``.
"""

from __future__ import annotations

import types

import pytest

from bubbleless_runtime import Pipeline
from bubbleless_runtime import interpreter as interpreter_module
from bubbleless_runtime._testing import (
    reference_grads,
    relative_error,
    stages_on_one_rank,
    tiny_batch,
    tiny_loss,
    tiny_model,
    v_gpipe,
)
from bubbleless_runtime.executor import INTERPRETER, Executor, execution_order
from bubbleless_runtime.interpreter import Interpreter
from bubbleless_schedules import Action, Kind, Schedule, add_communication, generate
from bubbleless_schedules.action import COMM_KINDS


def _actions(text: str) -> list[Action]:
    return [Action.parse(word) for word in text.split()]


def _text(actions) -> str:
    return " ".join(str(a) for a in actions)


# ---- the core, with a fake back end -------------------------------------------------------------


class _Clock:
    """Stands in for the ``time`` module inside the core: handlers move it forward by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


class _FakeBackend:
    def __init__(self, clock: _Clock) -> None:
        self.clock, self.log = clock, []

    def post(self, batch) -> None:
        self.log.append(("post", list(batch)))
        self.clock.now += 0.5  # posting is work of this worker


def _compute(backend, action, state):
    backend.log.append(("run", str(action)))
    backend.clock.now += 1.0
    if action.kind is Kind.B:  # waited 0.25 of that second for a peer
        state.blocked += 0.25


def _communicate(backend, action, state):
    backend.log.append(("run", str(action)))
    return [f"transfer {action}"]


def _fake_interpreter() -> Interpreter:
    compute = {kind: _compute for kind in (Kind.F, Kind.B)}
    comm = {kind: _communicate for kind in COMM_KINDS}
    return Interpreter(name="the fake back end", handlers={**compute, **comm}, batched=COMM_KINDS)


def test_rt_core_calls_handlers_in_order_and_posts_batched_work_together(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(interpreter_module, "time", clock)
    backend = _FakeBackend(clock)
    state = types.SimpleNamespace(spans=[], blocked=0.0)
    _fake_interpreter().run(backend, _actions("1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1RECV_F2 1F1 1SEND_B1"), state)
    assert backend.log == [
        ("run", "1RECV_F0"), ("run", "1RECV_F1"),
        ("post", ["transfer 1RECV_F0", "transfer 1RECV_F1"]),
        ("run", "1F0"),
        ("run", "1B0"),  # nothing batched before it: no post
        ("run", "1SEND_B0"), ("run", "1RECV_F2"),
        ("post", ["transfer 1SEND_B0", "transfer 1RECV_F2"]),
        ("run", "1F1"),
        ("run", "1SEND_B1"),
        ("post", ["transfer 1SEND_B1"]),  # trailing batched work is posted at the end
    ]  # fmt: skip
    # Spans of unbatched actions only; posting before an action is part of its span, blocked time is not.
    assert [(str(a), start, end) for a, start, end in state.spans] == [
        ("1F0", 100.0, 101.5),
        ("1B0", 101.75, 102.5),
        ("1F1", 102.5, 104.0),
    ]


def test_rt_core_posts_what_an_unbatched_handler_leaves_over(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(interpreter_module, "time", clock)
    backend = _FakeBackend(clock)
    state = types.SimpleNamespace(spans=[], blocked=0.0)
    unbatched = Interpreter(name="unbatched", handlers={Kind.SEND_F: _communicate, Kind.F: _compute})
    unbatched.run(backend, _actions("0F0 0SEND_F0"), state)
    assert backend.log == [("run", "0F0"), ("run", "0SEND_F0"), ("post", ["transfer 0SEND_F0"])]
    assert [str(a) for a, _, _ in state.spans] == ["0F0", "0SEND_F0"]


def test_rt_an_unknown_kind_names_the_back_end_and_the_action():
    with pytest.raises(ValueError, match=r"the fake back end cannot run 1W0 \(position 2\).*no handler for W"):
        _fake_interpreter().check(_actions("1RECV_F0 1F0 1W0"))


def test_rt_with_handler_adds_replaces_and_moves_kinds_in_and_out_of_batched():
    base = _fake_interpreter()
    added = base.with_handler(Kind.W, _compute)
    assert added.handlers[Kind.W] is _compute and Kind.W not in added.batched and Kind.W not in base.handlers
    unbatched = added.with_handler(Kind.SEND_F, _compute)
    assert unbatched.handlers[Kind.SEND_F] is _compute and Kind.SEND_F not in unbatched.batched
    assert Kind.SEND_F in base.batched and unbatched.name == base.name


# ---- execution_order: the multi-process executor's posting order ---------------------------------

LOWERED_1F1B = """\
# bubbleless-schedule name=1f1b stages=2 microbatches=3 placement=0,1 layout=pipeline meta.comm=1
0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0F2 0SEND_F2 0RECV_B1 0B1 0RECV_B2 0B2
1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F2 1F2 1B2 1SEND_B2
"""


def test_rt_lowered_1f1b_is_the_schedule_the_orders_below_start_from():
    assert add_communication(generate("1f1b", num_ranks=2, num_microbatches=3)).to_text() == LOWERED_1F1B


def test_rt_execution_order_without_prefetch_is_the_lowered_order():
    lowered = Schedule.from_text(LOWERED_1F1B)
    assert [execution_order(row, 0) for row in lowered.actions] == [list(row) for row in lowered.actions]


def test_rt_execution_order_hoists_the_receives_of_the_next_two_computes():
    lowered = Schedule.from_text(LOWERED_1F1B)
    rank0, rank1 = (_text(execution_order(row, 2)) for row in lowered.actions)
    # 0B0 is the second compute after 0F0, so its receive is posted before 0F0; each receive once.
    assert rank0 == "0RECV_B0 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B0 0RECV_B2 0F2 0SEND_F2 0B1 0B2"
    assert rank1 == "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1RECV_F2 1F1 1B1 1SEND_B1 1F2 1B2 1SEND_B2"


def test_rt_execution_order_keeps_every_action_once_and_computes_in_order():
    lowered = add_communication(v_gpipe(2, 4))
    for row in lowered.actions:
        for prefetch in range(4):
            order = execution_order(row, prefetch)
            assert sorted(order) == sorted(row)
            assert [a for a in order if a.kind not in COMM_KINDS] == [a for a in row if a.kind not in COMM_KINDS]
            sends = [a for a in order if a.kind in (Kind.SEND_F, Kind.SEND_B)]
            assert sends == [a for a in row if a.kind in (Kind.SEND_F, Kind.SEND_B)]  # only receives move


def test_rt_execution_order_refuses_a_negative_prefetch():
    with pytest.raises(ValueError, match="prefetch"):
        execution_order([], -1)


# ---- the multi-process executor's table is data ----------------------------------------------------


def _executor(lowered: Schedule, rank: int, **kwargs) -> Executor:
    return Executor(rank=rank, lowered=lowered, modules=dict.fromkeys(lowered.stages_of(rank)), loss_fn=tiny_loss,
                    channel=None, on_stage_done=lambda stage: None, **kwargs)


def test_rt_routes_come_from_the_layout():
    """In a V on 2 ranks, rank 1 holds stages 1 and 2: stage 1's forward input is received from rank 0,
    stage 2's is stage 1's output on this rank; backwards likewise for the gradient."""
    executor = _executor(add_communication(v_gpipe(2, 2)), 1)
    assert executor.routes[Action.parse("1F0")] == (("RECEIVED", Kind.RECV_F, 1, 0),)
    assert executor.routes[Action.parse("2F0")] == (("F", 1, 0),)
    assert executor.routes[Action.parse("2I1")] == (("F", 2, 1), ("RECEIVED", Kind.RECV_B, 2, 1))
    assert executor.routes[Action.parse("1I1")] == (("F", 1, 1), ("G", 2, 1))
    first = _executor(add_communication(v_gpipe(2, 2)), 0)
    assert first.routes[Action.parse("0F0")] == ()  # the micro-batch itself
    assert first.routes[Action.parse("3I0")] == (("F", 3, 0),)  # the loss stage: the loss is the root


def test_rt_the_executor_refuses_a_schedule_without_its_transfers():
    with pytest.raises(ValueError, match="add_communication"):
        _executor(generate("1f1b", num_ranks=2, num_microbatches=2), 0)


def _run_on_one_rank(schedule: Schedule, interpreter: Interpreter | None, num_microbatches: int):
    model, ref = tiny_model(schedule.num_stages + 1), tiny_model(schedule.num_stages + 1)
    inputs, targets = tiny_batch(2 * num_microbatches)
    ref_loss, ref_grads = reference_grads(ref, inputs, targets, num_microbatches)
    pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=tiny_loss,
                    interpreter=interpreter)
    loss = pipe.step(inputs, targets)
    worst = max(relative_error(p.grad, ref_grads[n]) for n, p in model.named_parameters())
    return pipe, abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)), worst


def test_rt_a_wrapped_forward_handler_runs_and_gradients_still_match():
    calls = []
    forward = INTERPRETER.handlers[Kind.F]

    def counting_forward(executor, action, state):
        calls.append(str(action))
        return forward(executor, action, state)

    schedule = stages_on_one_rank(3, num_microbatches=2)
    pipe, loss_error, grad_error = _run_on_one_rank(schedule, INTERPRETER.with_handler(Kind.F, counting_forward), 2)
    assert calls == ["0F0", "1F0", "2F0", "0F1", "1F1", "2F1"]
    assert loss_error <= 1e-6 and grad_error <= 1e-5
    assert INTERPRETER.handlers[Kind.F] is forward  # the default table is untouched


def test_rt_a_kind_the_executor_lacks_runs_with_a_user_handler():
    """R (recompute, a round-robin kind) means nothing to this back end; a user's handler for it runs at
    its place in the schedule, gets a span, and the gradients are unchanged."""
    base = stages_on_one_rank(2, num_microbatches=2)
    row = list(base.actions[0])
    row.insert(row.index(Action.parse("1B0")), Action.parse("1R0"))
    schedule = base.replace(actions=[row], name="with-a-marker")
    with pytest.raises(ValueError, match=r"the multi-process executor cannot run 1R0 \(position 4\)"):
        Pipeline(tiny_model(3), schedule=schedule, num_microbatches=2, loss_fn=tiny_loss)

    seen = []

    def marker(executor, action, state):
        seen.append((str(action), sorted(state.outputs)))

    pipe, loss_error, grad_error = _run_on_one_rank(schedule, INTERPRETER.with_handler(Kind.R, marker), 2)
    assert seen == [("1R0", [(0, 0), (0, 1), (1, 0), (1, 1)])]
    assert loss_error <= 1e-6 and grad_error <= 1e-5
    assert [span.action for span in pipe.last_timeline.spans] == row
