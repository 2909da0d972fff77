"""What the pool's saved-tensor hooks keep and count: an output saved for its own backward (tanh, softmax)
is freed with its graph, a failed step's graphs included, and an uploaded input a layer saves is counted
on the device's budget once, with the rest of what autograd keeps; the plan's estimate of a held
micro-batch holds the upload in full, as the executor reserves it."""

import gc
import threading
import weakref

import pytest
import torch
from torch import nn

from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_worker import POOL
from bubbleless_schedules import Kind
from bubbleless_schedules.roundrobin_layout import PoolGroups

M = 4
SAVED_OUTPUTS: list = []  # weak references to the storages of the probe's tanh and softmax outputs
GRAD_CALLS = {"count": 0, "fail_at": None}  # module-wide: the pool runs copies of the block, not the block
GRAD_CALLS_LOCK = threading.Lock()


class SelfSavingBlock(nn.Module):
    """A block whose tanh and softmax outputs are saved for their own backward (the hooks' cycle case).
    With GRAD_CALLS' `fail_at` set it raises at that grad-enabled call, before building anything: the
    calls before it have built their graphs, whichever micro-batches they were."""

    def forward(self, activation):
        hidden, aux, index = activation
        if torch.is_grad_enabled():
            with GRAD_CALLS_LOCK:  # the pool's workers are threads: count and compare as one step
                GRAD_CALLS["count"] += 1
                failing = GRAD_CALLS["count"] == GRAD_CALLS["fail_at"]
            if failing:
                raise RuntimeError("a block that fails mid-step")
        squashed, shares = torch.tanh(hidden), torch.softmax(hidden, dim=-1)
        if torch.is_grad_enabled():
            SAVED_OUTPUTS.extend(weakref.ref(t.untyped_storage()) for t in (squashed, shares))
        return hidden + squashed + shares, aux, index


def _probed_model():
    layers = list(tiny_model(7))
    return nn.Sequential(*layers[:5], SelfSavingBlock(), *layers[5:])


def test_rt_pool_memory_saved_outputs_die_with_their_graph_even_when_a_step_fails():
    """A pack hook returning its input keeps an output saved for its own backward in a cycle with its
    graph: B frees it, but the graphs a failed step leaves are dropped unrun and stayed alive for good."""
    model, ref = _probed_model(), _probed_model()
    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=M, loss_fn=tiny_loss,
                              partition=PoolGroups((3, 3), 2, (1, 2, 3)), timeout=60)
    inputs, targets = tiny_batch(8)
    for fails in (False, True, False):
        SAVED_OUTPUTS.clear()
        GRAD_CALLS["fail_at"] = GRAD_CALLS["count"] + 2 if fails else None  # after one micro-batch's graph is built
        if fails:
            with pytest.raises(RuntimeError, match="fails mid-step"):
                pipe.step(inputs, targets)
        else:
            loss = pipe.step(inputs, targets)
        gc.collect()
        assert SAVED_OUTPUTS and all(ref() is None for ref in SAVED_OUTPUTS), \
            f"{sum(ref() is not None for ref in SAVED_OUTPUTS)} saved outputs alive after the step (failed: {fails})"
        assert all(w.budget.used == 0 for w in pipe.workers)
    want_loss, want = reference_grads(ref, inputs, targets, M)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    assert max(relative_error(got[n], 2 * want[n]) for n in want) <= 1e-5  # .grad adds up the two steps that ran
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


WIDTH, ROWS = 16, 8


def _budget_growth_per_action(model, kinds):
    """One step of ``model`` on two CPU devices (groups 2 / 1 / 1, 1), recording how much each action of
    ``kinds`` grew its device's budget: (the pipeline, [(action, bytes)])."""
    grown = []

    def watched(handler):
        def run(worker, action, state):
            before = worker.budget.used
            handler(worker, action, state)
            grown.append((action, worker.budget.used - before))
        return run

    pipe = RoundRobinPipeline(model, devices=["cpu", "cpu"], num_microbatches=M, partition=PoolGroups((2,), 1, (1, 1)),
                              loss_fn=lambda out, target: nn.functional.mse_loss(out, target, reduction="sum"),
                              timeout=60)
    interpreter = POOL
    for kind in kinds:
        interpreter = interpreter.with_handler(kind, watched(POOL.handlers[kind]))
    pipe.interpreter = interpreter
    pipe.step(torch.randn(ROWS, WIDTH), torch.randn(ROWS, WIDTH))
    return pipe, grown


def test_rt_pool_memory_an_uploaded_input_a_layer_saves_counts_once():
    """A job of one Linear + tanh holds its uploaded input (which the linear saves) and the tanh output
    it saves: the budget grows by exactly those two while its forward with a graph runs (R, the last F).
    The job at layer 0 on a CPU device reads the caller's micro-batch as it is (no copy to count): its
    tanh output only."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(3)])
    pipe, grown = _budget_growth_per_action(model, (Kind.R, Kind.F))
    activation = ROWS // M * WIDTH * 4  # one micro-batch's float32 activation, in bytes
    groups = pipe.groups
    graphs = {a: g for a, g in grown if a.kind is Kind.R or groups.role(a.stage) == "last"}
    assert len(graphs) == 3 * M, grown  # two backward jobs' R and the last job's F, per micro-batch
    want = {a: (2 if groups.layers(a.stage).start > 0 else 1) * activation for a in graphs}
    assert graphs == want  # the input once (not again where the linear saves it), and the tanh output
    assert all(w.budget.used == 0 for w in pipe.workers)


class _NoWeights:
    def weight_bytes(self, layers) -> int:
        return 0


def test_rt_pool_memory_fit_check_counts_the_upload_in_full_beside_the_saved_bytes():
    """``check_fits``' activation bytes: a held micro-batch's upload in full, what its layers save, and the
    gradient it hands down. A profile does not say whether a layer's saved bytes hold its input, so a
    first layer that saves more than its input (layer 1) or less (layer 3) adds the upload all the same."""
    from bubbleless_partition import LayerCost, Profile
    from bubbleless_runtime.pool_memory import device_peaks
    from bubbleless_schedules import Schedule

    schedule = Schedule.from_text(
        "# bubbleless-schedule name=roundrobin stages=5 microbatches=1 layout=roundrobin "
        "meta.forward_layers=2,1 meta.last_layers=1 meta.backward_layers=1,2\n"
        "0F0 2F0 2B0 4R0 4B0\n1F0 3R0 3B0\n")  # jobs 2 = layer 3, 3 = R/B layers 1-2, 4 = R/B layer 0
    saved = [5, 30, 20, 4]
    profile = Profile(layers=tuple(LayerCost(name=f"l{i}", forward=1.0, input_grad=1.0, weight_grad=1.0,
                                             activation_bytes_per_token=a,
                                             output_bytes_per_token=10) for i, a in enumerate(saved)))
    peaks = [peak for peak, _ in device_peaks(schedule, _NoWeights(), profile)]
    # device 0: job 2 keeps 4 + its 10-byte upload + its 10-byte gradient; device 1: job 3 30 + 20 + 10 + 10
    assert peaks == [4 + 10 + 10, 30 + 20 + 10 + 10]


class _TanhFirst(nn.Module):
    """tanh, then a Linear: tanh saves its output (which the Linear saves again, one storage), never the
    block's input, so the executor's upload of that input is a storage the profile's saved bytes lack."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.linear(torch.tanh(x))


def test_rt_pool_memory_estimate_holds_the_upload_of_a_layer_that_saves_something_else():
    """What the plan counts for a held micro-batch (``held_microbatch_bytes``, less the gradient it hands
    down at B) equals what the executor reserves while the job's R runs, for blocks whose first saved
    tensor is not their input. Counting the upload only where it exceeds the first layer's saved bytes
    (the rule before) left out one boundary here."""
    from bubbleless_runtime.auto_partition import measure
    from bubbleless_runtime.pool_plan_cap import held_microbatch_bytes

    torch.manual_seed(0)
    model = nn.Sequential(*[_TanhFirst() for _ in range(3)])
    profile = measure(list(model), torch.randn(ROWS // M, WIDTH), repeats=1)
    pipe, grown = _budget_growth_per_action(model, (Kind.R,))
    groups = pipe.groups
    graphs = {a: g for a, g in grown if a.kind is Kind.R}
    assert len(graphs) == 2 * M, grown
    activation = ROWS // M * WIDTH * 4
    boundary = [c.output_bytes_per_token * profile.tokens_per_microbatch for c in profile.layers]
    for action, reserved in graphs.items():
        layers = groups.layers(action.stage)
        handed_down = boundary[layers.start - 1] if layers.start else 0
        gradient = max(handed_down, boundary[layers.stop - 1])  # B's: the larger of the one down and the one up
        assert reserved == (2 if layers.start else 1) * activation  # the upload and the tanh output (layer 0: none)
        assert held_microbatch_bytes(groups, action.stage, profile) - gradient == reserved, action


class _ScaledBlock(nn.Module):
    """Linear, times a buffer (which the product saves for its backward), then tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, WIDTH))

    def forward(self, x):
        return torch.tanh(self.linear(x) * self.scale)


def test_rt_pool_memory_a_saved_buffer_is_the_jobs_not_an_activation():
    """A buffer autograd saves (a scale the product needs for its input gradient) belongs to the job's
    weights, as a parameter does: a graph's budget grows by its input and the tanh output only."""
    torch.manual_seed(0)
    model = nn.Sequential(*[_ScaledBlock() for _ in range(3)])
    pipe, grown = _budget_growth_per_action(model, (Kind.R,))
    activation = ROWS // M * WIDTH * 4
    graphs = {a: g for a, g in grown if a.kind is Kind.R}
    assert len(graphs) == 2 * M, grown
    assert graphs == {a: (2 if pipe.groups.layers(a.stage).start > 0 else 1) * activation for a in graphs}
