"""The backward split: I gives input gradients and leaves linear weights untouched; W completes them."""

from __future__ import annotations

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


def test_rt_frozen_and_non_leaf_weights_are_not_deferred():
    torch.manual_seed(0)
    frozen = nn.Linear(4, 4)
    frozen.requires_grad_(False)
    shared = nn.Parameter(torch.randn(4, 4))
    x = torch.randn(3, 4, requires_grad=True)
    queue = []
    with defer_weight_grads(queue):
        out = nn.functional.linear(frozen(x), shared * 2)  # the weight is not a leaf: plain autograd
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
