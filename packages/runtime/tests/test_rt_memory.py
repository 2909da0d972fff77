"""What a rank holds for backward stays within what its schedule says (no timing: bytes counted).

The schedule's memory model (``bubbleless_schedules.simulate``, ``input_grad_frees=0``): a stage's F
adds that stage's activations of one micro-batch, I frees nothing, W (or B) frees them. Walked over a
rank's actions with the bytes each F really saved (``SavedBytes``: autograd's hooks, each storage once,
until the storage dies), it gives the most the rank may hold; the step's measured peak stays under it.
A deferred weight gradient that records a graph on ``.grad`` (W run with grad mode on) keeps every
micro-batch's inputs and output gradients alive until the gradients are dropped, a ZB-V rank then holds
about 1.5x its schedule's peak (measured on the tiny bench model, bench/results/measured.md), and
these tests fail.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bubbleless_runtime import defer_weight_grads, run_weight_grads, spawn
from bubbleless_runtime._testing import tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.comm import Channel, PipelineCommError, Transfer
from bubbleless_runtime.saved_bytes import SavedBytes
from bubbleless_schedules import Kind, generate

WIDTH, ROWS_PER_MICROBATCH = 128, 32


def test_rt_weight_gradients_hold_no_graph_and_free_what_w_needed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(8, 16, requires_grad=True)
    queue = []
    with SavedBytes() as saved:
        with defer_weight_grads(queue):
            out = model(x)
        out.pow(2).sum().backward()  # I: the graph goes, the linears' inputs stay for W
        del out
        kept_for_w = saved.live - x.nbytes  # x: saved by the first linear, and held here
        run_weight_grads(queue)  # W
        assert kept_for_w > 0 and saved.live == x.nbytes, (kept_for_w, saved.live)
    for p in model.parameters():
        assert p.grad is not None and p.grad.grad_fn is None and not p.grad.requires_grad


def test_rt_saved_bytes_counts_each_storage_once_until_it_dies():
    a = torch.randn(1000, requires_grad=True)
    with SavedBytes() as saved:
        y = (a * 2).sin()  # saves a*2 (4000 bytes) for sin's backward; mul saves no tensor of a's
        z = y[:10].exp()  # saves a view of exp's output: its own 40-byte storage
        assert saved.live == 4000 + 40
        del y, z
        assert saved.live == 0 and saved.peak == 4040


def _saved_per_action(rank: int, name: str, num_microbatches: int) -> dict:
    from bubbleless_runtime import Pipeline
    from bubbleless_runtime.executor import INTERPRETER

    torch.set_num_threads(1)
    schedule = generate(name, num_ranks=dist.get_world_size(), num_microbatches=num_microbatches)
    saved, trace = SavedBytes(), []
    table = INTERPRETER
    for kind in (Kind.F, Kind.I, Kind.W, Kind.B):
        def traced(backend, action, state, handler=INTERPRETER.handlers[kind]):
            before = saved.live
            out = handler(backend, action, state)
            trace.append((action.kind.value, action.stage, before, saved.live))
            return out
        table = table.with_handler(kind, traced)
    model = tiny_model(2 * schedule.num_stages, width=WIDTH)  # two layers a stage
    pipe = Pipeline(model, schedule=schedule, num_microbatches=num_microbatches, loss_fn=tiny_loss,
                    interpreter=table, trace=False)
    inputs, targets = tiny_batch(ROWS_PER_MICROBATCH * num_microbatches, width=WIDTH)
    pipe.step(inputs, targets)  # the first step learns the shapes
    trace.clear()
    with saved:
        pipe.step(*tiny_batch(ROWS_PER_MICROBATCH * num_microbatches, width=WIDTH))  # this call holds the batch
    graphs_on_grads = sum(p.grad is not None and p.grad.grad_fn is not None for p in pipe.parameters())
    return {"trace": trace, "peak": saved.peak, "left": saved.live, "graphs_on_grads": graphs_on_grads}


def schedule_bound(trace) -> int:
    """The schedule's memory model walked over one rank's actions in the order they ran: F adds what
    that stage's F saved (the most over its micro-batches), I frees nothing, W and B free it."""
    per_stage: dict[int, int] = {}
    for kind, stage, before, after in trace:
        if kind == "F":
            per_stage[stage] = max(per_stage.get(stage, 0), after - before)
    held = peak = 0
    for kind, stage, _, _ in trace:
        held += {"F": per_stage[stage], "W": -per_stage[stage], "B": -per_stage[stage]}.get(kind, 0)
        peak = max(peak, held)
    return peak


@pytest.fixture
def children_import_this_module(monkeypatch):
    """The spawned ranks unpickle ``_saved_per_action`` by this module's dotted name, which they can
    import as namespace packages once the repository root is on their ``sys.path``."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["zbv", "zb-h1", "1f1b"])
def test_rt_rank_holds_no_more_than_its_schedule_says(name, children_import_this_module):
    per_rank = spawn(_saved_per_action, 2, name, 4, threads_per_process=1, timeout=120)
    for rank, report in enumerate(per_rank):
        bound = schedule_bound(report["trace"])
        assert bound > 0, (rank, report["trace"])
        # One stage boundary's tensors of slack: a stage's output, saved by the next stage on this rank,
        # lives until its own stage's I (the model frees it at W); 3 tensors of ROWS x WIDTH floats.
        slack = 3 * ROWS_PER_MICROBATCH * WIDTH * 4
        assert report["peak"] <= bound + slack, (name, rank, report["peak"], bound, report["trace"])
        assert report["left"] == 0, (name, rank, report["left"])  # nothing saved outlives the step
        assert report["graphs_on_grads"] == 0, (name, rank)


class _Work:
    def __init__(self, done: bool, fails: bool = False) -> None:
        self.done, self.fails = done, fails

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout=None) -> bool:
        if self.fails:
            raise RuntimeError("connection closed by peer")
        return True


def _channel_with(sends) -> Channel:
    channel = Channel.__new__(Channel)  # no process group: only the send bookkeeping is exercised
    channel.timeout, channel.rank, channel.sends = 1.0, 0, list(sends)
    return channel


def test_rt_a_completed_send_lets_go_of_its_tensor_before_the_step_ends():
    done, pending = torch.zeros(4), torch.zeros(4)
    kept = weakref.ref(done)
    channel = _channel_with([Transfer(True, 1, done, 0, "a", work=_Work(True)),
                             Transfer(True, 1, pending, 1, "b", work=[_Work(True), _Work(False)])])
    del done
    channel.release_finished_sends()
    assert kept() is None  # the delivered send's tensor is gone
    assert [t.label for t in channel.sends] == ["b"]  # a coalesced send waits for all of its works
    failed = _channel_with([Transfer(True, 1, torch.zeros(1), 2, "the activation", work=_Work(True, fails=True))])
    with pytest.raises(PipelineCommError, match="sending the activation"):
        failed.release_finished_sends()
