"""profile() measures a real torch model: positive costs, real byte counts, no torch at package import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bubbleless_partition import cut, profile

torch = pytest.importorskip("torch")


def test_part_import_does_not_load_torch():
    code = "import sys, bubbleless_partition; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_part_profile_tiny_sequential():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 16),
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
        torch.nn.Linear(16, 50),
    )
    tokens = torch.randint(0, 50, (2, 8))
    measured = profile(model, tokens, repeats=3, names=["embed", "up", "act", "down", "head"])
    assert measured.tokens_per_microbatch == 16 and measured.source == "measured on cpu"
    by_name = {layer.name: layer for layer in measured.layers}
    for layer in measured.layers:
        assert layer.forward > 0 and layer.recompute > 0, layer
    for name in ("up", "down", "head"):
        assert by_name[name].input_grad > 0 and by_name[name].weight_grad > 0
    assert by_name["embed"].input_grad == 0.0 and by_name["embed"].weight_grad > 0  # ids take no gradient
    assert by_name["act"].weight_grad == 0.0 and by_name["act"].param_bytes == 0  # GELU has no weights
    assert by_name["up"].param_bytes == (16 * 64 + 64) * 4
    assert by_name["up"].output_bytes_per_token == 64 * 4
    assert by_name["down"].activation_bytes_per_token >= 64 * 4  # Linear saves its input
    part = cut(measured, num_stages=2)
    assert sum(part.sizes) == 5 and part.bottleneck > 0


def test_part_profile_rejects_tuple_outputs():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(ValueError, match="return one tensor"):
        profile([Pair()], torch.zeros(2, 3), repeats=1)
