"""Checkpoint directories that are complete or absent, never half-written, and finding the newest one.

Writing ``<parent>/checkpoint-12`` (``write_directory``, every rank together):

1. rank 0 empties ``<parent>/.checkpoint-12.partial``; every rank writes its files there, each fsynced;
2. rank 0 gathers every file's size and sha256 and writes ``manifest.json`` last (the step, the files,
   the world size, the cut, the schedule, package versions), fsyncs it and the directory;
3. rank 0 renames the directory into place (an older one of that name is moved aside first), fsyncs
   the parent, updates ``<parent>/latest`` (written to a temporary file and renamed over it), and
   removes checkpoints beyond the newest ``keep``.

A directory is complete when its manifest reads and every file it lists is there with its size
(``check_complete``); loading also checks each file's sha256. A run killed at any moment leaves either
the previous complete checkpoint or both; the ``.partial`` directory it may leave is never taken for a
checkpoint and is removed by the next write (old checkpoints, too, are renamed away before removal). Multi-node runs need ``output_dir`` on a shared file system.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from importlib import metadata

from .checkpoint_state import fsync_dir, read_json

MANIFEST = "manifest.json"
LATEST = "latest"
FORMAT = "bubbleless-checkpoint"
VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d+)$")
_PACKAGES = ("bubbleless-runtime", "bubbleless-schedules", "bubbleless-partition", "bubbleless-offload", "torch")


def partial_path(directory: str) -> str:
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.partial")


def file_record(path: str) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"size": os.path.getsize(path), "sha256": digest.hexdigest()}


def versions() -> dict[str, str]:
    found = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def publish(partial: str, directory: str, manifest: dict, *, keep: int) -> None:
    """Rank 0, after every rank has written into ``partial``: manifest, rename, ``latest``, pruning."""
    manifest = {"format": FORMAT, "version": VERSION, **manifest, "versions": versions()}
    path = os.path.join(partial, MANIFEST)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(partial)
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    aside = None
    if os.path.exists(directory):  # a checkpoint of that name from an earlier run: replace it
        aside = partial + ".old"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(directory, aside)
    os.rename(partial, directory)
    fsync_dir(parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    write_latest(parent, os.path.basename(directory))
    if keep > 0:
        prune(parent, keep, protect=directory)


def write_latest(parent: str, name: str) -> None:
    temporary = os.path.join(parent, f".{LATEST}.tmp")
    with open(temporary, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, os.path.join(parent, LATEST))
    fsync_dir(parent)


def check_complete(directory: str) -> dict:
    """The manifest of a complete checkpoint; ValueError saying what is missing otherwise."""
    if not os.path.isdir(directory):
        raise ValueError(f"checkpoint {directory} does not exist")
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        legacy = any(n.endswith(".pt") for n in os.listdir(directory))
        raise ValueError(
            f"checkpoint {directory} is incomplete: it has no {MANIFEST}, so its writing was cut short"
            + (" (or it was written by an older version as rank*.pt files, which are not loaded: they would "
               "need unpickling)" if legacy else " (or it is not a bubbleless checkpoint)")
        )
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a bubbleless checkpoint manifest")
    for name, record in manifest.get("files", {}).items():
        file = os.path.join(directory, name)
        if not os.path.isfile(file):
            raise ValueError(f"checkpoint {directory} is incomplete: {name} is missing")
        if os.path.getsize(file) != record["size"]:
            raise ValueError(f"{file}: {os.path.getsize(file)} bytes, its manifest says {record['size']}: the file "
                             "is truncated or was changed")
    return manifest


def verify_file(directory: str, name: str, manifest: dict) -> str:
    """The path of ``name`` after checking its sha256 against the manifest (ValueError naming it if not)."""
    path = os.path.join(directory, name)
    if name not in manifest.get("files", {}):
        raise ValueError(f"checkpoint {directory} lists no file {name}")
    want = manifest["files"][name]
    got = file_record(path)
    if got != want:
        raise ValueError(f"{path}: checksum or size differs from its manifest (sha256 {got['sha256'][:12]}..., "
                         f"expected {want['sha256'][:12]}...): the file is corrupt")
    return path


def complete_checkpoints(parent: str) -> list[tuple[int, str]]:
    """(step, path) of every complete ``checkpoint-<step>`` under ``parent``, oldest first."""
    if not os.path.isdir(parent):
        return []
    found = []
    for name in os.listdir(parent):
        match = _NAME.match(name)
        if match:
            path = os.path.join(parent, name)
            try:
                check_complete(path)
            except ValueError:
                continue
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_complete(parent: str) -> str | None:
    found = complete_checkpoints(parent)
    return found[-1][1] if found else None


def prune(parent: str, keep: int, *, protect: str) -> None:
    """Remove all but the newest ``keep`` complete checkpoints, and partial ones left by killed writes."""
    found = complete_checkpoints(parent)
    for _, path in found[:-keep]:
        if os.path.abspath(path) != os.path.abspath(protect):
            # renamed away first: a kill during the removal must not leave a half-deleted checkpoint-N
            doomed = os.path.join(parent, f".{os.path.basename(path)}.deleting")
            shutil.rmtree(doomed, ignore_errors=True)
            os.rename(path, doomed)
    for name in os.listdir(parent):
        if name.startswith(".checkpoint-") and name.endswith((".partial", ".partial.old", ".deleting")):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def resolve(resume: str, output_dir: str) -> str:
    """The complete checkpoint ``train.resume`` means: ``latest`` (the newest complete one under
    ``output_dir``) or a directory, checked complete; ValueError naming the newest complete one if not."""
    if resume == "latest":
        newest = newest_complete(output_dir)
        if newest is None:
            raise ValueError(f"train.resume is latest but {output_dir} holds no complete checkpoint; "
                             "drop --resume to start afresh")
        return newest
    try:
        check_complete(resume)
    except ValueError as error:
        parent = os.path.dirname(os.path.abspath(resume))
        newest = newest_complete(parent)
        hint = (f"; the newest complete checkpoint there is {newest}: resume from it (or --resume latest)"
                if newest else f"; {parent} holds no complete checkpoint")
        raise ValueError(f"{error}{hint}") from error
    return resume
