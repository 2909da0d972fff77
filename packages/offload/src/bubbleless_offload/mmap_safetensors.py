"""``mmap_safetensors``: the tensors of a .safetensors file, memory-mapped, with no copy into RAM.

LoRA base weights are read and never written, so they need not occupy RAM: pages come from the file
when a transfer first touches them and the kernel may drop them again. The reader follows the
published format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N,
N bytes of JSON mapping each name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
relative to the end of the header; an optional ``"__metadata__"`` entry of strings), then raw
little-endian bytes. Written here rather than imported so the package depends on torch alone.

The file is mapped copy-on-write (``ACCESS_COPY``), so the tensors are writable without touching the
file (a write copies only the page written) and ``torch.frombuffer`` needs no read-only workaround.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import sys
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["SAFETENSORS_DTYPES", "map_frozen", "mmap_safetensors"]

# safetensors dtype names -> torch dtypes (those this torch build has)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr)
    for name, attr in {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
        "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
        "U16": "uint16", "U32": "uint32", "U64": "uint64",
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    }.items()
    if hasattr(torch, attr)
}

_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit on the JSON header


def mmap_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor in the file at ``path``, by name, as CPU tensors backed by a memory map.

    The map stays open while any of the tensors lives. ValueError for a file that breaks the format.
    """
    if sys.byteorder != "little":
        raise ValueError("mmap_safetensors needs a little-endian host (safetensors stores little-endian bytes)")
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < 8:
            raise ValueError(f"{path}: {size} bytes is too short for a safetensors file (8-byte header length first)")
        (header_len,) = struct.unpack("<Q", file.read(8))
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"{path}: header length {header_len} does not fit a {size}-byte file; is it safetensors?"
            )
        header = json.loads(file.read(header_len))
        data_start = 8 + header_len
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) if size > data_start else None
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor_view(path, name, entry, mapped, data_start, size)
    return tensors


def map_frozen(host_params, path: str | os.PathLike, key_of: Callable[[str], str] | None) -> set[int]:
    """Point frozen ``HostParam``s' data at the file's tensors (no copy); the ids of those replaced.

    ``key_of`` maps a store name (``"3.linear.weight"``) to the file's key (None: the same name).
    Frozen parameters whose key the file lacks are left as they are; trainable ones are never touched.
    """
    tensors = mmap_safetensors(path)
    replaced = set()
    for hp in host_params:
        key = key_of(hp.name) if key_of is not None else hp.name
        if hp.trainable or key not in tensors:
            continue
        tensor, p = tensors[key], hp.param
        if tensor.shape != p.shape or tensor.dtype != p.dtype:
            raise ValueError(
                f"{path}: {key!r} is {tensor.dtype} {list(tensor.shape)} but parameter {hp.name} is "
                f"{p.dtype} {list(p.shape)}; build the model in the file's dtype (a conversion would copy "
                f"the weights into RAM) or map the right key with safetensors_key="
            )
        if p.device.type == "meta":  # ``.data`` cannot change a meta tensor's type: swap the whole tensor in
            torch.utils.swap_tensors(p, nn.Parameter(tensor, requires_grad=False))
        else:
            p.data = tensor
        replaced.add(id(hp))
    return replaced


def _tensor_view(path, name: str, entry: dict, mapped, data_start: int, size: int) -> torch.Tensor:
    dtype_name, shape, (begin, end) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
    if dtype_name not in SAFETENSORS_DTYPES:
        raise ValueError(
            f"{path}: tensor {name!r} has dtype {dtype_name!r}; this torch reads {sorted(SAFETENSORS_DTYPES)}"
        )
    dtype = SAFETENSORS_DTYPES[dtype_name]
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes or begin < 0 or data_start + end > size:
        raise ValueError(
            f"{path}: tensor {name!r} ({dtype_name} {shape}) needs {nbytes} bytes but its data_offsets "
            f"[{begin}, {end}] give {end - begin} (file data ends at {size - data_start})"
        )
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=data_start + begin)
    return flat.view(dtype).view(shape)
