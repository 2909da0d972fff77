"""SavedStorages counts each saved storage once, until it dies, parameters and excluded storages left out."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bubbleless_partition.saved_tensors import SavedStorages  # noqa: E402  (after the torch skip)


def test_part_saved_storages_count_each_storage_once_until_it_dies():
    a = torch.randn(1000, requires_grad=True)
    calls = []
    with SavedStorages(on_save=lambda t, added: calls.append(added)) as saved:
        y = (a * 2).sin()  # sin saves a * 2: 4000 bytes
        z = y[:10] * y[10:20]  # two views of y's storage (which sin does not save): 4000 bytes once
        assert (saved.live, saved.total) == (8000, 8000)
        del z
        assert saved.live == 8000  # y is still alive: a counted storage counts as long as anything holds it
        del y  # y, and with it sin's graph and a * 2
    assert (saved.live, saved.peak, saved.total) == (0, 8000, 8000)
    assert calls == [4000, 4000, 0]


def test_part_saved_storages_leave_out_parameters_and_excluded_storages():
    linear = torch.nn.Linear(8, 8)
    table = torch.randn(16, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with SavedStorages() as everything:
        kept = linear(x)  # saves x and a view of the weight (a Parameter's transpose)
    assert everything.live == x.nbytes
    with SavedStorages() as counted:
        scaled = x * table[:4]  # saves only the view of table (x's gradient reads it): the whole storage counts
    assert counted.live == table.nbytes
    with SavedStorages(excluded=[table]) as saved:
        scaled = x * table[:4]
    assert saved.total == 0
    del kept, scaled


def test_part_saved_storages_count_only_their_device():
    x = torch.randn(4, 8, requires_grad=True)
    with SavedStorages(device=torch.device("meta")) as elsewhere:
        y = x.tanh()
    assert elsewhere.total == 0
    del y
