"""mmap_safetensors reads what the safetensors package writes; frozen params can come from such a file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from torch import nn

from bubbleless_offload import HostStore, mmap_safetensors

try:
    from safetensors.torch import save_file
except ImportError:  # the reader is still tested on hand-written files below
    save_file = None

needs_safetensors = pytest.mark.skipif(
    save_file is None, reason="the safetensors package is not installed (pip install 'bubbleless-offload[test]')"
)


def write_by_hand(path, tensors: dict[str, torch.Tensor], metadata=None) -> None:
    """The published format, written independently of our reader: length, JSON header, raw bytes."""
    codes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.bool: "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        raw = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        span = [offset, offset + len(raw)]
        header[name] = {"dtype": codes[tensor.dtype], "shape": list(tensor.shape), "data_offsets": span}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def sample() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "a.weight": torch.randn(4, 3),
        "b": torch.randn(5).to(torch.bfloat16),
        "steps": torch.arange(6, dtype=torch.int64).view(2, 3),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 2),
    }


@needs_safetensors
def test_round_trip_with_files_the_safetensors_package_writes(tmp_path):
    tensors = sample()
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded = mmap_safetensors(tmp_path / "model.safetensors")
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_round_trip_with_a_hand_written_file(tmp_path):
    tensors = sample()
    write_by_hand(tmp_path / "hand.safetensors", tensors, metadata={"note": "x"})
    loaded = mmap_safetensors(tmp_path / "hand.safetensors")
    assert sorted(loaded) == sorted(tensors)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())
    loaded["a.weight"].add_(1.0)  # copy-on-write: the file is never changed
    assert torch.equal(mmap_safetensors(tmp_path / "hand.safetensors")["a.weight"], tensors["a.weight"])


def test_broken_files_are_value_errors(tmp_path):
    (tmp_path / "short").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        mmap_safetensors(tmp_path / "short")
    (tmp_path / "huge").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ValueError, match="does not fit"):
        mmap_safetensors(tmp_path / "huge")
    header = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "offsets").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    with pytest.raises(ValueError, match="needs 16 bytes"):
        mmap_safetensors(tmp_path / "offsets")


class Adapted(nn.Module):
    """A frozen base projection plus a trainable low-rank adapter, LoRA-style."""

    def __init__(self, base_device="cpu") -> None:
        super().__init__()
        self.base = nn.Linear(6, 6, bias=False, device=base_device)
        self.base.weight.requires_grad_(False)
        self.down, self.up = nn.Linear(6, 2, bias=False), nn.Linear(2, 6, bias=False)


def frozen_file(tmp_path, layers) -> str:
    path = tmp_path / "base.safetensors"
    write_by_hand(path, {f"model.{i}.base.weight": layer.base.weight.detach() for i, layer in enumerate(layers)})
    return str(path)


def test_frozen_params_replaced_from_the_file_keep_their_values(tmp_path):
    torch.manual_seed(1)
    source = [Adapted(), Adapted()]
    path = frozen_file(tmp_path, source)
    torch.manual_seed(2)
    layers = [Adapted(base_device="meta"), Adapted(base_device="meta")]  # never allocated in RAM
    store = HostStore(layers, pin_memory=False, frozen_safetensors=path, safetensors_key=lambda name: f"model.{name}")
    for mine, theirs in zip(layers, source, strict=True):
        assert mine.base.weight.device.type == "cpu" and torch.equal(mine.base.weight, theirs.base.weight)
    assert [hp.name for hp in store.trainable] == ["0.down.weight", "0.up.weight", "1.down.weight", "1.up.weight"]
    assert all(hp.master is None for hp in store.params if not hp.trainable)


def test_a_file_tensor_of_another_dtype_is_refused_not_copied(tmp_path):
    source = [Adapted()]
    path = frozen_file(tmp_path, source)
    layers = [Adapted().to(torch.bfloat16)]
    layers[0].base.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="build the model in the file's dtype"):
        HostStore(layers, pin_memory=False, frozen_safetensors=path, safetensors_key=lambda name: f"model.{name}")
