"""Systems by name, each with a modelled runner now and a measured runner later, under the same name.

    register("zero-infinity", modelled=zero_infinity)        # bench/modelled/baselines.py
    register("zero-infinity", measured=run_deepspeed)        # the measured harness, when it lands

A modelled runner is a pure function ``Point -> Prediction``. A measured runner's signature is the
measured harness's business; the registry only keeps both under one ``System`` so a report can put a
system's modelled and measured numbers side by side. Our stage-bound schedules register themselves on
first use under every name ``bubbleless_schedules`` knows (``1f1b`` excepted: that name is the torch
1F1B baseline; ours is ``bubbleless-1f1b``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .common import Point, Prediction


@dataclass
class System:
    name: str
    description: str = ""
    baseline: bool = False
    """An independent system we compare against (not ours)."""
    modelled: Callable[[Point], Prediction] | None = None
    measured: Callable | None = None


SYSTEMS: dict[str, System] = {}


def register(name: str, *, modelled=None, measured=None, description: str = "", baseline: bool = False) -> System:
    """Add a runner to ``name`` (creating the system); a runner already there is an error."""
    system = SYSTEMS.setdefault(name, System(name=name, description=description, baseline=baseline))
    for kind, runner in (("modelled", modelled), ("measured", measured)):
        if runner is None:
            continue
        if getattr(system, kind) is not None:
            raise ValueError(f"system {name!r} already has a {kind} runner")
        setattr(system, kind, runner)
    system.description = system.description or description
    system.baseline = system.baseline or baseline
    return system


def _load_builtin() -> None:
    from . import baselines, ours, ours_pool  # noqa: F401  (registering is importing)


def systems() -> dict[str, System]:
    _load_builtin()
    return SYSTEMS


def predict(name: str, point: Point) -> Prediction:
    """The modelled prediction of system ``name`` at ``point``."""
    table = systems()
    if name not in table or table[name].modelled is None:
        known = sorted(n for n, s in table.items() if s.modelled is not None)
        raise ValueError(f"unknown modelled system {name!r}; known: {', '.join(known)}")
    return table[name].modelled(point)
