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
    assert by_name["down"].activation_bytes_per_token == 64 * 4  # Linear saves its input, not its weight
    assert by_name["up"].activation_bytes_per_token == 16 * 4
    part = cut(measured, num_stages=2)
    assert sum(part.sizes) == 5 and part.bottleneck > 0


def test_part_profile_rejects_tuple_outputs():
    class Pair(torch.nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(ValueError, match="return one tensor"):
        profile([Pair()], torch.zeros(2, 3), repeats=1)


ROWS, WIDTH = 32, 32  # one micro-batch of 32 tokens, each WIDTH float32 values


def _kept_bytes(layer, sample) -> float:
    """Activation bytes of one micro-batch, as the profile gives them to ``Profile.layer_memory``."""
    measured = profile([layer], sample, repeats=1, warmup=0)
    return measured.layers[0].activation_bytes_per_token * measured.tokens_per_microbatch


def test_part_linear_keeps_its_input_not_its_weight():
    x = torch.randn(4, 8, WIDTH)  # 32 tokens
    assert _kept_bytes(torch.nn.Linear(WIDTH, WIDTH), x) == x.nbytes == 4096  # the weight is param_bytes


class _TwoReaders(torch.nn.Module):
    """x read by two linears and squared: four saves of x's storage, one allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.a(x) + self.b(x) + x * x


def test_part_a_tensor_saved_by_several_ops_counts_once():
    x = torch.randn(ROWS, WIDTH)
    assert _kept_bytes(_TwoReaders(), x) == x.nbytes


class _Block(torch.nn.Module):
    """A pre-norm MLP block: x + down(gelu(up(norm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_part_mlp_block_keeps_what_its_backward_reads():
    x = torch.randn(ROWS, WIDTH)
    per_token = 4 * (
        WIDTH + 2  # the norm: its input, and the mean and 1/std of each row
        + WIDTH  # up: the normed input
        + 4 * WIDTH  # gelu: its input, up's output
        + 4 * WIDTH  # down: gelu's output; the residual add saves nothing
    )
    assert _kept_bytes(_Block(WIDTH), x) == ROWS * per_token == 41216


class _CachedScale(torch.nn.Module):
    """Scales by a slice of a buffer (as a rotary cache is sliced): mul saves the slice, a view of a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.rand(2 * ROWS, WIDTH))

    def forward(self, x):
        return x * self.cache[: x.shape[0]]


def test_part_buffers_and_scratch_are_not_activations():
    x = torch.randn(ROWS, WIDTH)
    assert _kept_bytes(_CachedScale(), x) == 0  # held once, whatever the micro-batches in flight

    class Scratch(torch.nn.Module):
        def forward(self, x):
            (x * 2).sin()  # saves x * 2, freed with its graph before the layer returns
            return x.tanh()  # saves its output, kept until the backward

    assert _kept_bytes(Scratch(), x) == x.nbytes


def test_part_a_micro_batch_sliced_from_a_batch_counts_its_own_bytes():
    ids = torch.randint(0, 50, (8, 16))  # the batch; the embedding saves the ids it reads
    assert _kept_bytes(torch.nn.Embedding(50, 8), ids[:2]) == ids[:2].nbytes  # not the batch's storage
