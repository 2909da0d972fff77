"""Checkpoint directories that are complete or absent, never half-written, and finding the newest one.

Writing ``<parent>/checkpoint-12`` (``write_directory``, every rank together):

1. rank 0 empties ``<parent>/.checkpoint-12.partial``; every rank writes its files there, each fsynced;
2. rank 0 gathers every file's size and sha256 and writes ``manifest.json`` last (the step, the files,
   the world size, the cut, the schedule, package versions), fsyncs it and the directory;
3. rank 0 renames the directory into place (an older one of that name is moved aside first), fsyncs
   the parent, updates ``<parent>/latest`` (written to a temporary file and renamed over it), and
   removes checkpoints beyond the newest ``keep`` (below).

A directory is complete when its manifest reads and every file it lists is there with its size
(``check_complete``); loading also checks each file's sha256. A run killed at any moment leaves either
the previous complete checkpoint or both; the ``.partial`` directory it may leave is never taken for a
checkpoint and is removed by the next write (old checkpoints, too, are renamed away before removal). Multi-node runs need ``output_dir`` on a shared file system.

An ``output_dir`` may also hold an earlier run's checkpoints, of higher steps than this run's; step
numbers alone would then pick the wrong run's. So "newest" means "written last", not "highest step":

- ``latest`` (``latest_complete``) is the complete checkpoint written last, whatever its step (the
  manifest's ``written`` time, as for pruning). The ``latest`` file names the same one once a write has
  finished; a write killed between publishing its checkpoint and updating the file leaves the file one
  behind, and the checkpoint just published is still taken.
- Pruning keeps the checkpoint just written and the ``keep - 1`` others written last (the manifest's
  ``written`` time; for a manifest without one, the manifest file's mtime), whatever their steps.
- ``bubbleless train`` warns when it will write checkpoints into an ``output_dir`` already holding ones of a
  higher step than it starts from (``train_pipelines.warn_of_later_checkpoints``).
- ``--resume <a run's output_dir>`` (a directory holding checkpoints and ``latest``, not a checkpoint)
  resumes that directory's ``latest``, as ``--output-dir <it> --resume latest`` does (``resolve``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
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
    manifest = {"format": FORMAT, "version": VERSION, **manifest, "versions": versions(), "written": time.time()}
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


def _complete(parent: str) -> list[tuple[int, str, dict]]:
    """(step, path, manifest) of every complete ``checkpoint-<step>`` under ``parent``, by step."""
    if not os.path.isdir(parent):
        return []
    found = []
    for name in os.listdir(parent):
        match = _NAME.match(name)
        if match:
            path = os.path.join(parent, name)
            try:
                manifest = check_complete(path)
            except ValueError:
                continue
            found.append((int(match.group(1)), path, manifest))
    return sorted(found, key=lambda entry: entry[:2])


def complete_checkpoints(parent: str) -> list[tuple[int, str]]:
    """(step, path) of every complete ``checkpoint-<step>`` under ``parent``, lowest step first."""
    return [(step, path) for step, path, _ in _complete(parent)]


def newest_complete(parent: str) -> str | None:
    """The complete checkpoint of the highest step under ``parent`` (None: none)."""
    found = complete_checkpoints(parent)
    return found[-1][1] if found else None


def latest_complete(parent: str) -> str | None:
    """What ``--resume latest`` means under ``parent``: the complete checkpoint written last (ties: the
    higher step); None when there is none."""
    found = [(_written(path, manifest), step, path) for step, path, manifest in _complete(parent)]
    return max(found)[2] if found else None


def _written(path: str, manifest: dict) -> float:
    written = manifest.get("written")
    if isinstance(written, (int, float)) and not isinstance(written, bool):
        return float(written)
    return os.path.getmtime(os.path.join(path, MANIFEST))  # written before manifests kept the time


def prune(parent: str, keep: int, *, protect: str) -> None:
    """Keep ``protect`` (the checkpoint just written) and the ``keep - 1`` other complete checkpoints written
    last (not the highest steps: an earlier run's may be there); remove the rest, and partial ones."""
    protect = os.path.abspath(protect)
    others = sorted((_written(path, manifest), step, path) for step, path, manifest in _complete(parent)
                    if os.path.abspath(path) != protect)
    for _, _, path in others[: max(0, len(others) - (keep - 1))]:
        # renamed away first: a kill during the removal must not leave a half-deleted checkpoint-N
        doomed = os.path.join(parent, f".{os.path.basename(path)}.deleting")
        shutil.rmtree(doomed, ignore_errors=True)
        os.rename(path, doomed)
    for name in os.listdir(parent):
        if name.startswith(".checkpoint-") and name.endswith((".partial", ".partial.old", ".deleting")):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def is_run_directory(path: str) -> bool:
    """Whether ``path`` is a run's output directory (it holds ``latest`` or ``checkpoint-<step>``
    directories and is no checkpoint itself), not a checkpoint."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, MANIFEST)):
        return False
    names = os.listdir(path)
    return LATEST in names or any(_NAME.match(n) and os.path.isdir(os.path.join(path, n)) for n in names)


def resolve(resume: str, output_dir: str) -> str:
    """The complete checkpoint ``train.resume`` means: ``latest`` (``latest_complete`` under ``output_dir``),
    a run directory (its ``latest_complete``), or a checkpoint directory, checked complete; ValueError
    naming the one to resume from if not."""
    if resume == "latest":
        found = latest_complete(output_dir)
        if found is None:
            raise ValueError(f"train.resume is latest but {output_dir} holds no complete checkpoint; "
                             "drop --resume to start afresh")
        return found
    if is_run_directory(resume):
        found = latest_complete(resume)
        if found is None:
            raise ValueError(f"train.resume {resume} is a run's output directory, not a checkpoint, and it holds no "
                             "complete checkpoint; name a checkpoint-<step> directory, or drop --resume to start "
                             "afresh")
        return found
    try:
        check_complete(resume)
    except ValueError as error:
        parent = os.path.dirname(os.path.abspath(resume))
        newest = latest_complete(parent)
        hint = (f"; the newest complete checkpoint there is {newest}: resume from it (or --resume latest)"
                if newest else f"; {parent} holds no complete checkpoint")
        raise ValueError(f"{error}{hint}") from error
    return resume
