"""HostOptimizer equals a plain torch optimizer on the same model; the fp16 scaler skips and backs off."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from offload_models import batch, loss_of, tied_layers

from bubbleless_offload import DynamicLossScaler, HostOptimizer, HostStore
from bubbleless_offload.host_optimizer import fused_cpu_available

SETTINGS = {
    "adamw": {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-7, "weight_decay": 0.1},
    "adam": {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.05},
    "sgd": {"lr": 1e-1, "momentum": 0.9, "weight_decay": 0.01},
}


def parameters(layers) -> list[torch.nn.Parameter]:
    """The unique parameters of a layer list, in model order (as ``model.parameters()`` gives them)."""
    return list(torch.nn.ModuleList(layers).parameters())


def plain_optimizer(layers, name, settings, fused=False):
    """Built as the runtime's ``build_optimizer`` builds it: matrices with decay first, then the rest."""
    params = parameters(layers)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": settings["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=settings["lr"], momentum=settings["momentum"])
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    kernel = {"fused": True} if fused else {}
    return cls(groups, lr=settings["lr"], betas=settings["betas"], eps=settings["eps"], **kernel)


def grads_into_store(store: HostStore, layers, seed: int) -> None:
    """Backward on the caller's layers, then move each .grad into the host accumulators."""
    loss_of(layers, *batch(seed)).backward()
    for hp in store.trainable:
        store.accumulate(hp, hp.param.grad)
        hp.param.grad = None


@pytest.mark.parametrize("fused", [None, False], ids=["default-kernel", "foreach"])
@pytest.mark.parametrize("clip", [0.0, 0.5], ids=["no-clip", "clip"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_three_steps_equal_the_plain_torch_optimizer(name, clip, fused):
    ours, theirs = tied_layers(seed=3), tied_layers(seed=3)
    store = HostStore(ours, pin_memory=False)
    optimizer = HostOptimizer(store, name=name, max_grad_norm=clip, fused=fused, **SETTINGS[name])
    plain = plain_optimizer(theirs, name, SETTINGS[name], fused=optimizer.fused)
    assert [len(g["params"]) for g in optimizer.param_groups] == [len(g["params"]) for g in plain.param_groups]
    for step in range(3):
        grads_into_store(store, ours, step)
        loss_of(theirs, *batch(step)).backward()
        norm = torch.nn.utils.clip_grad_norm_(parameters(theirs), clip if clip > 0 else math.inf)
        plain.step()
        plain.zero_grad()
        result = optimizer.step()
        assert not result.skipped and result.grad_norm == pytest.approx(float(norm), rel=1e-6)
    for mine, reference in zip(parameters(ours), parameters(theirs), strict=True):
        assert torch.equal(mine, reference)
    assert all(not hp.grad.any() for hp in store.trainable)  # zeroed for the next iteration


@pytest.mark.skipif(not fused_cpu_available(), reason="torch < 2.4 has no fused CPU Adam")
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_default_fused_kernel_equals_torchs_default_adam_within_fp32_rounding(name):
    ours, theirs = tied_layers(seed=5), tied_layers(seed=5)
    store = HostStore(ours, pin_memory=False)
    optimizer = HostOptimizer(store, name=name, max_grad_norm=0.5, **SETTINGS[name])
    assert optimizer.fused and optimizer.torch_optimizer.defaults["fused"] is True
    plain = plain_optimizer(theirs, name, SETTINGS[name])  # torch's default (foreach) kernel
    assert not plain.defaults.get("fused")
    for step in range(5):
        grads_into_store(store, ours, step)
        loss_of(theirs, *batch(step)).backward()
        torch.nn.utils.clip_grad_norm_(parameters(theirs), 0.5)
        plain.step()
        plain.zero_grad()
        optimizer.step()
    for mine, reference in zip(parameters(ours), parameters(theirs), strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)
    assert not HostOptimizer(HostStore(tied_layers(), pin_memory=False), fused=False).fused
    assert not HostOptimizer(HostStore(tied_layers(), pin_memory=False), name="sgd").fused


def test_bf16_working_weights_follow_the_fp32_masters():
    layers = tied_layers(dtype=torch.bfloat16)
    store = HostStore(layers, pin_memory=False)
    optimizer = HostOptimizer(store, name="sgd", lr=0.1)
    hp = store.trainable[1]
    store.accumulate(hp, torch.ones(hp.param.shape))
    optimizer.step()
    assert hp.master.dtype == torch.float32 and torch.equal(hp.param.data, hp.master.to(torch.bfloat16))


def test_an_inf_gradient_skips_the_step_leaves_weights_and_backs_the_scale_off():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    scaler = DynamicLossScaler(initial_scale=1024.0, growth_interval=2)
    optimizer = HostOptimizer(store, name="adamw", lr=0.1, loss_scaler=scaler)
    before = [hp.param.detach().clone() for hp in store.params]
    grads_into_store(store, layers, 0)
    store.trainable[2].grad[0] = math.inf
    result = optimizer.step()
    assert result.skipped and math.isnan(result.grad_norm) and scaler.scale == 512.0
    assert all(torch.equal(hp.param, b) for hp, b in zip(store.params, before, strict=True))
    assert all(not hp.grad.any() for hp in store.trainable) and not optimizer.torch_optimizer.state
    # a good step divides by the (new) scale before stepping
    reference = tied_layers()
    plain = plain_optimizer(reference, "adamw", {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})
    grads_into_store(store, layers, 1)
    for hp in store.trainable:
        hp.grad.mul_(512.0)  # as if the loss had been scaled by 512
    loss_of(reference, *batch(1)).backward()
    plain.step()
    assert not optimizer.step().skipped
    for mine, theirs in zip(parameters(layers), parameters(reference), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_nan_gradients_skip_even_without_a_scaler():
    store = HostStore(tied_layers(), pin_memory=False)
    optimizer = HostOptimizer(store, name="sgd", lr=0.1)
    store.trainable[0].grad.fill_(math.nan)
    before = [hp.master.clone() for hp in store.trainable]
    assert optimizer.step().skipped
    assert all(torch.equal(hp.master, b) for hp, b in zip(store.trainable, before, strict=True))


def test_scaler_grows_after_good_steps_and_disabled_does_nothing():
    scaler = DynamicLossScaler(initial_scale=8.0, growth_interval=2)
    grads = [torch.full((3,), 8.0)]
    assert scaler.unscale_(grads) is False and torch.equal(grads[0], torch.ones(3))
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 16.0 and scaler.good_steps == 0
    scaler.update(True)
    assert scaler.scale == 8.0
    assert scaler.unscale_([torch.tensor([1.0, math.nan]), None]) is True
    off = DynamicLossScaler(enabled=False)
    assert off.scale == 1.0 and off.unscale_([torch.tensor([math.inf])]) is False
    off.update(True)
    assert off.scale == 1.0
    restored = DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.good_steps) == (scaler.scale, scaler.good_steps)


def test_state_dict_round_trip_resumes_identically():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    optimizer = HostOptimizer(store, name="adamw", lr=0.05, loss_scaler=DynamicLossScaler(enabled=False))
    grads_into_store(store, layers, 0)
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    twin_layers = copy.deepcopy(layers)
    twin_store = HostStore(twin_layers, pin_memory=False)
    twin = HostOptimizer(twin_store, name="adamw", lr=0.05, loss_scaler=DynamicLossScaler(enabled=False))
    twin.load_state_dict(saved)
    for layer_set, the_store, opt in ((layers, store, optimizer), (twin_layers, twin_store, twin)):
        grads_into_store(the_store, layer_set, 1)
        opt.step()
    for a, b in zip(parameters(layers), parameters(twin_layers), strict=True):
        assert torch.equal(a, b)


def test_lr_scheduler_drives_the_inner_torch_optimizer():
    store = HostStore(tied_layers(), pin_memory=False)
    optimizer = HostOptimizer(store, lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.torch_optimizer, lambda step: 0.5 ** step)
    optimizer.step()
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "lamb"}, r"unknown; choose one of \['adam', 'adamw', 'sgd'\]"),
        ({"lr": -1.0}, "lr must be a finite number >= 0"),
        ({"betas": (0.9, 1.0)}, r"betas must be two numbers in \[0, 1\)"),
        ({"betas": (0.9,)}, "betas must be two numbers"),
        ({"eps": math.nan}, "eps must be"),
        ({"max_grad_norm": -0.1}, "max_grad_norm must be"),
        ({"fused": "yes"}, "fused must be None"),
        ({"name": "sgd", "fused": True}, r"'sgd' has no fused CPU kernel; use one of \['adam', 'adamw'\]"),
    ],
)
def test_bad_settings_are_value_errors_that_name_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HostOptimizer(HostStore(tied_layers(), pin_memory=False), **kwargs)


def test_a_store_without_trainable_params_is_refused():
    layers = tied_layers()
    for layer in layers:
        layer.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        HostOptimizer(HostStore(layers, pin_memory=False))
