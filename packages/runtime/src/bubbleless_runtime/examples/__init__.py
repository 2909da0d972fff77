"""Data the runtime ships for its demos (package data): see ``DATA_LICENSE.md``."""

from __future__ import annotations

import os


def example_path(name: str) -> str:
    """The absolute path of a shipped example file (e.g. ``instructions.jsonl``)."""
    path = os.path.join(os.path.dirname(__file__), name)
    if not os.path.isfile(path):
        raise ValueError(f"no example file {name!r} is shipped; have {sorted(os.listdir(os.path.dirname(__file__)))}")
    return path
