"""A trainer's state as two files that load without unpickling: tensors in safetensors, the rest in JSON.

``split(state)`` walks nested dicts, lists and tuples: every tensor goes into a flat ``{key: tensor}``
map (its key is its path, ``optimizer.state.3.exp_avg``) and is replaced in the tree by
``{"__tensor__": key}``; tuples become ``{"__tuple__": [...]}`` and dicts whose keys are not all plain
strings (the optimizer's integer parameter ids) ``{"__items__": [[key, value], ...]}``. ``join``
undoes it. Numbers, strings, booleans and None pass through; anything else is refused by path, so
nothing a loader would have to execute can get into a checkpoint.
"""

from __future__ import annotations

import json
import os

import torch

_MARKERS = ("__tensor__", "__tuple__", "__items__")


def split(state) -> tuple[object, dict[str, torch.Tensor]]:
    """(JSON-able tree, tensors by key) for ``state``."""
    tensors: dict[str, torch.Tensor] = {}
    return _encode(state, "", tensors), tensors


def _encode(value, path: str, tensors: dict):
    if isinstance(value, torch.Tensor):
        key = path or "tensor"
        tensors[key] = value.detach().cpu().contiguous().clone()  # safetensors refuses shared storage
        return {"__tensor__": key}
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return value
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{path}.{i}".lstrip("."), tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{path}.{i}".lstrip("."), tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and k not in _MARKERS for k in value):
            return {k: _encode(v, f"{path}.{k}".lstrip("."), tensors) for k, v in value.items()}
        return {"__items__": [[_encode(k, f"{path}.key{i}".lstrip("."), tensors),
                               _encode(v, f"{path}.{k}".lstrip("."), tensors)] for i, (k, v) in enumerate(value.items())]}
    raise TypeError(f"checkpoint state at {path or 'the top'} is a {type(value).__name__}, which a checkpoint "
                    "cannot store without pickling; keep to tensors, numbers, strings, lists, tuples and dicts")


def join(tree, tensors: dict[str, torch.Tensor], *, source: str):
    """``split``'s inverse; ValueError naming ``source`` when the tree refers to a tensor not there."""
    if isinstance(tree, list):
        return [join(v, tensors, source=source) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        key = tree["__tensor__"]
        if key not in tensors:
            raise ValueError(f"{source}: the state refers to tensor {key!r}, which its tensor file does not hold")
        return tensors[key]
    if "__tuple__" in tree:
        return tuple(join(v, tensors, source=source) for v in tree["__tuple__"])
    if "__items__" in tree:
        return {join(k, tensors, source=source): join(v, tensors, source=source) for k, v in tree["__items__"]}
    return {k: join(v, tensors, source=source) for k, v in tree.items()}


def write(state, tensor_path: str, json_path: str) -> None:
    """Write ``state`` as a safetensors file and a JSON file, each flushed to disk (fsync)."""
    from safetensors.torch import save_file

    tree, tensors = split(state)
    save_file(tensors, tensor_path)
    fsync_file(tensor_path)
    with open(json_path, "w") as f:
        json.dump(tree, f)
        f.flush()
        os.fsync(f.fileno())


def read(tensor_path: str, json_path: str):
    """``write``'s state back; one ValueError naming the file for anything corrupt, truncated or foreign."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(tensor_path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{tensor_path}: not a readable safetensors file ({exc}); the checkpoint is corrupt "
                         "or was not written by bubbleless") from exc
    tree = read_json(json_path)
    return join(tree, tensors, source=json_path)


def read_json(path: str):
    """A JSON file's content; ValueError naming the file when it is missing, corrupt or truncated."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise ValueError(f"{path}: missing") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); the file is corrupt or truncated") from exc


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a rename, a new file) durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
