"""HostStore: one entry per unique parameter, fp32 masters and accumulators, frozen params left alone."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from offload_models import tied_layers
from torch import nn

from bubbleless_offload import HostStore


def test_a_tied_weight_is_one_host_param_with_one_accumulator():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    first = dict(store.layer_params(0))["emb.weight"]
    last = dict(store.layer_params(3))["proj.weight"]
    assert first is last and first.name == "0.emb.weight"
    assert len(store.params) == len({id(p) for layer in layers for p in layer.parameters()})
    assert sum(hp is first for hp in store.params) == 1
    # the shared weight is counted once in a job holding both ends, and in each job holding one
    both, head = store.weight_bytes([0, 3]), store.weight_bytes([3])
    assert both == store.weight_bytes([0]) + head - first.nbytes


def test_layer_params_keep_named_parameters_order_and_local_names():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    for index, layer in enumerate(layers):
        names = [name for name, _ in store.layer_params(index)]
        assert names == [name for name, _ in layer.named_parameters(remove_duplicate=False)]
    with pytest.raises(ValueError, match="out of range; this store has layers 0..3"):
        store.layer_params(4)


def test_fp32_masters_are_the_callers_tensors_not_copies():
    layers = tied_layers()
    store = HostStore(layers, pin_memory=False)
    for hp in store.trainable:
        assert hp.master.data_ptr() == hp.param.data_ptr()
        assert hp.grad.dtype == torch.float32 and not hp.grad.any()


def test_bf16_masters_are_fp32_copies_and_sync_working_writes_them_back():
    layers = tied_layers(dtype=torch.bfloat16)
    store = HostStore(layers, pin_memory=False)
    hp = store.trainable[1]
    assert hp.param.dtype == torch.bfloat16 and hp.master.dtype == torch.float32
    assert hp.master.data_ptr() != hp.param.data_ptr()
    assert torch.equal(hp.master, hp.param.data.float())
    before = hp.param.detach().clone()
    with torch.no_grad():
        hp.master.add_(1.0)
    assert torch.equal(hp.param.detach(), before)  # working weights change only on sync
    store.sync_working()
    assert torch.equal(hp.param.detach(), hp.master.to(torch.bfloat16))


def test_frozen_params_get_no_master_and_no_gradient():
    layers = tied_layers()
    for p in layers[1].parameters():
        p.requires_grad_(False)
    store = HostStore(layers, pin_memory=False)
    frozen = [hp for _, hp in store.layer_params(1)]
    assert all(not hp.trainable and hp.master is None and hp.grad is None for hp in frozen)
    assert not set(map(id, frozen)) & set(map(id, store.trainable))
    assert store.grad_bytes([1]) == 0 and store.grad_bytes([2]) > 0
    with pytest.raises(ValueError, match="frozen"):
        store.accumulate(frozen[0], torch.zeros_like(frozen[0].param))


def test_accumulate_adds_any_dtype_into_fp32_and_zero_grad_clears():
    store = HostStore(tied_layers(), pin_memory=False)
    hp = store.trainable[1]
    store.accumulate(hp, torch.ones(hp.param.shape, dtype=torch.bfloat16))
    store.accumulate(hp, torch.full(hp.param.shape, 2.0))
    assert torch.equal(hp.grad, torch.full(hp.param.shape, 3.0))
    with pytest.raises(ValueError, match="shape"):
        store.accumulate(hp, torch.ones(3))
    store.zero_grad()
    assert not hp.grad.any()


def test_accumulate_all_checks_every_gradient_before_adding_any_and_batches_add_them_all(monkeypatch):
    import bubbleless_offload.host_store as host_store

    store = HostStore(tied_layers(), pin_memory=False)
    grads = [(hp, torch.full(hp.param.shape, float(i + 1)), None) for i, hp in enumerate(store.trainable)]
    with pytest.raises(ValueError, match="shape"):
        store.accumulate_all([*grads, (store.trainable[0], torch.ones(3), None)])
    assert not any(hp.grad.any() for hp in store.trainable)  # the bad last entry stopped every add
    monkeypatch.setattr(host_store, "STAGE_BYTES", 64)  # a batch per gradient or two
    store.accumulate_all(grads)
    into = torch.zeros_like(store.trainable[0].grad)
    store.accumulate_all([(store.trainable[0], torch.ones_like(into), into)])
    for i, hp in enumerate(store.trainable):
        assert torch.equal(hp.grad, torch.full(hp.param.shape, float(i + 1))), hp.name
    assert torch.equal(into, torch.ones_like(into))


def test_four_threads_accumulating_at_once_equal_the_serial_sum():
    store = HostStore(tied_layers(), pin_memory=False)
    # integer-valued grads: every order of adding gives the same fp32 sum, so equality is exact
    work = [
        [(hp, torch.randint(-8, 8, hp.param.shape).float()) for _ in range(25) for hp in store.trainable]
        for _ in range(4)
    ]
    serial = {id(hp): torch.zeros_like(hp.grad) for hp in store.trainable}
    for items in work:
        for hp, grad in items:
            serial[id(hp)] += grad
    start = threading.Barrier(4)

    def run(items):
        start.wait()
        for hp, grad in items:
            store.accumulate(hp, grad)

    threads = [threading.Thread(target=run, args=(items,)) for items in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for hp in store.trainable:
        assert torch.equal(hp.grad, serial[id(hp)]), hp.name


def test_grads_to_params_fills_param_grad_as_backward_would():
    layers = tied_layers(dtype=torch.bfloat16)
    store = HostStore(layers, pin_memory=False)
    hp = store.trainable[0]
    store.accumulate(hp, torch.full(hp.param.shape, 0.5))
    store.grads_to_params()
    assert hp.param.grad.dtype == torch.bfloat16 and torch.equal(hp.param.grad.float(), hp.grad)
    assert hp.param.grad.data_ptr() != hp.grad.data_ptr()
    store.grads_to_params()  # adds onto an existing .grad, like a second backward
    assert torch.equal(hp.param.grad.float(), 2 * hp.grad)


def test_masters_with_grads_feed_a_torch_optimizer():
    store = HostStore(tied_layers(), pin_memory=False)
    masters = store.masters_with_grads()
    assert [m.grad is hp.grad for m, hp in zip(masters, store.trainable, strict=True)] == [True] * len(masters)
    assert all(hp.param.grad is None for hp in store.trainable)  # the caller's .grad is untouched


def test_master_state_round_trip_restores_masters_and_working_weights():
    store = HostStore(tied_layers(dtype=torch.bfloat16), pin_memory=False)
    saved = {name: t.clone() for name, t in store.master_state_dict().items()}
    with torch.no_grad():
        for hp in store.trainable:
            hp.master.add_(3.0)
    store.load_master_state_dict(saved)
    for hp in store.trainable:
        assert torch.equal(hp.master, saved[hp.name]) and torch.equal(hp.param.data, saved[hp.name].bfloat16())
    with pytest.raises(ValueError, match="lacks"):
        store.load_master_state_dict({})


def test_pin_memory_defaults_to_whether_an_accelerator_exists():
    store = HostStore(tied_layers())
    assert store.pin_memory is torch.cuda.is_available()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin=False"):
            HostStore(tied_layers(), pin_memory=True)


def test_bad_layers_and_meta_parameters_are_value_errors():
    with pytest.raises(ValueError, match="non-empty sequence of nn.Module"):
        HostStore([], pin_memory=False)
    with torch.device("meta"):
        layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="meta device"):
        HostStore([layer], pin_memory=False)


def test_importing_the_package_probes_no_device():
    probe = (
        "import torch\n"
        "def refuse(*a, **k): raise AssertionError('device probed at import')\n"
        "torch.cuda.is_available = refuse\n"
        "torch.cuda.device_count = refuse\n"
        "torch.cuda.init = refuse\n"
        "import bubbleless_offload\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
