"""The backward split: I gives input gradients and leaves linear weights untouched; W completes them.
Only ``nn.Linear`` layers defer, only in the thread that opened the deferral, and torch's ``nn.Linear``
is itself again once no deferral is open."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from bubbleless_runtime import defer_weight_grads, run_weight_grads


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("bias", [True, False])
def test_rt_linear_weight_gradient_waits_for_w(bias):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5, bias=bias), nn.LayerNorm(5), nn.Tanh(), nn.Linear(5, 3, bias=bias))
    x = torch.randn(2, 4, 6, requires_grad=True)  # a leading batch and sequence dimension
    model(x).pow(2).sum().backward()
    want_x, want = x.grad.clone(), _grads(model)
    model.zero_grad(set_to_none=True)
    x.grad = None

    queue = []
    with defer_weight_grads(queue):
        out = model(x)
    out.pow(2).sum().backward()  # I
    assert torch.allclose(x.grad, want_x, rtol=1e-6)
    assert model[0].weight.grad is None and model[3].weight.grad is None  # linear weights wait for W
    assert model[1].weight.grad is not None  # the norm's gradient comes with I
    assert len(queue) == 2
    run_weight_grads(queue)  # W
    assert not queue
    for got, expected in zip(_grads(model), want, strict=True):
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_rt_frozen_non_leaf_and_functional_weights_are_not_deferred():
    torch.manual_seed(0)
    frozen = nn.Linear(4, 4)
    frozen.requires_grad_(False)
    shared = nn.Parameter(torch.randn(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    queue = []
    with defer_weight_grads(queue):
        out = nn.functional.linear(frozen(x), shared * 2)  # the weight is not a leaf: plain autograd
        out = nn.functional.linear(out, shared)  # F.linear outside an nn.Linear: its gradient comes with I
    out.sum().backward()
    assert queue == [] and shared.grad is not None and x.grad is not None


def test_rt_weight_grads_accumulate_over_microbatches():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    xs = torch.randn(4, 3).chunk(2)
    sum(layer(x).sum() for x in xs).backward()
    want = layer.weight.grad.clone()
    layer.zero_grad(set_to_none=True)
    queues = [[], []]
    for x, queue in zip(xs, queues, strict=True):
        with defer_weight_grads(queue):
            out = layer(x)
        out.sum().backward()
    for queue in reversed(queues):  # W may run in any order
        run_weight_grads(queue)
    assert torch.allclose(layer.weight.grad, want)


def test_rt_linear_is_torchs_own_again_once_no_deferral_is_open():
    torch_forward = nn.Linear.forward
    with defer_weight_grads([]):
        assert nn.Linear.forward is not torch_forward
        with defer_weight_grads([]):
            pass
        assert nn.Linear.forward is not torch_forward  # the outer one is still open
    assert nn.Linear.forward is torch_forward


def test_rt_innermost_deferral_takes_the_linears():
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    outer, inner = [], []
    with defer_weight_grads(outer):
        with defer_weight_grads(inner):
            a = layer(x)
        b = layer(x)
    (a.sum() + b.sum()).backward()
    assert len(outer) == 1 and len(inner) == 1


def test_rt_deferral_is_per_thread():
    """A thread with no deferral open computes its linears' weight gradients in its own backward, while
    another thread defers (the device pool's worker threads)."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 5)
    x = torch.randn(3, 5)
    opened, other_done = threading.Event(), threading.Event()
    seen = {}

    def other_thread():
        opened.wait()
        copy = nn.Linear(5, 5)
        copy.load_state_dict(layer.state_dict())
        copy(x).sum().backward()
        seen["grad"] = copy.weight.grad
        other_done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    queue = []
    with defer_weight_grads(queue):
        out = layer(x)
        opened.set()
        other_done.wait()
    thread.join()
    out.sum().backward()
    assert seen["grad"] is not None and layer.weight.grad is None and len(queue) == 1
    run_weight_grads(queue)
    assert torch.allclose(layer.weight.grad, seen["grad"])


def test_rt_linear_subclass_overriding_forward_gets_its_gradient_in_i():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * nn.functional.linear(x, self.weight, self.bias)

    torch.manual_seed(0)
    model = nn.Sequential(Scaled(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(3, 4, requires_grad=True)
    model(x).pow(2).sum().backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    queue = []
    with defer_weight_grads(queue):
        model(x).pow(2).sum().backward()
    assert model[0].weight.grad is not None and model[2].weight.grad is None and len(queue) == 1
    run_weight_grads(queue)
    for a, b in zip(_grads(model), want, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_rt_lora_adapters_defer_and_the_frozen_base_does_not():
    """peft's LoRA layer: the base linear is frozen (passes the input gradient on, queues nothing), the
    adapters' inner nn.Linear layers queue their weight gradients; gradients equal a plain backward."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"], init_lora_weights=False))
    x = torch.randn(2, 5, 6, requires_grad=True)
    model(x).pow(2).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    queue = []
    with defer_weight_grads(queue):
        out = model(x)
    out.pow(2).sum().backward()
    assert all(p.grad is None for p in model.parameters())  # every trainable weight is an adapter's: all wait
    assert len(queue) == 4  # lora_A and lora_B of both layers
    run_weight_grads(queue)
    got = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert set(got) == set(want) and len(got) == 4
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-7), name
