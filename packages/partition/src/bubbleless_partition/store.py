"""Profiles to and from YAML, so a profile measured on one machine can be cut on another."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from .layers import LayerCost, Profile

FORMAT = "bubbleless-partition/profile-v1"
"""Written at the top of every file; loading refuses anything else."""


def profile_to_dict(profile: Profile) -> dict:
    data = {"format": FORMAT, "time_unit": "ms", "size_unit": "bytes"}
    for f in fields(Profile):
        if f.name != "layers":
            data[f.name] = getattr(profile, f.name)
    data["layers"] = [asdict(layer) for layer in profile.layers]
    return data


def profile_from_dict(data: dict) -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not a partition profile: expected format {FORMAT!r}, found {found!r}")
    known = {f.name for f in fields(Profile)}
    unknown = set(data) - known - {"format", "time_unit", "size_unit"}
    if unknown:
        raise ValueError(f"unknown profile fields {sorted(unknown)}; known: {sorted(known)}")
    layer_fields = {f.name for f in fields(LayerCost)}
    layers = []
    for index, entry in enumerate(data.get("layers") or []):
        extra = set(entry) - layer_fields
        if extra:
            raise ValueError(f"layer {index} has unknown fields {sorted(extra)}; known: {sorted(layer_fields)}")
        layers.append(LayerCost(**entry))
    values = {k: v for k, v in data.items() if k in known and k != "layers"}
    return Profile(layers=tuple(layers), **values)


def save_profile(profile: Profile, path: str | Path) -> Path:
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(profile_to_dict(profile), sort_keys=False))
    return path


def load_profile(path: str | Path) -> Profile:
    import yaml

    return profile_from_dict(yaml.safe_load(Path(path).read_text()))
