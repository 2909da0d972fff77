"""The comparison grid of issue 11: shapes x cost profiles x memory limits, shared by every bench.

    from bench.schedules.grid import cases, costs_for
    for case in cases(ps=(4, 8), profiles=("unit", "1.5B")):
        case.p, case.m, case.costs_name, case.costs, case.memory_limit

``cases`` yields ``Case(p, m, costs_name, costs, memory_limit)``: every p in {2, 4, 8, 16, 32}, m in
{p, 2p, 3p+1, 4p, 8p} (3p+1 is the odd one), each cost profile below and each memory limit in M_B
floor((p+4)/3) (V-Min's), floor((p+2)/2) (V-Half's), p (1F1B's), 1.5p and 2p (ZB-H2's), duplicates
dropped (p=2 has three distinct limits). Every argument narrows the grid; ``quick=True`` is a small fixed
subset for tests. ``case.costs`` is for one stage per rank; a schedule with v stages per rank (V shapes)
asks ``costs_for(case.costs_name, num_stages=2 * p, stages_per_rank=2)``, which spreads a
heterogeneous profile over its stages (each stage 1/v of the rank's cost, scaled by its factor).

Cost profiles, (F, I, W, C) per rank's share of the model:

- ``unit``: (1, 1, 1, 0), the papers' closed forms;
- ``1.5B``: (18.5, 18.1, 9.3, 0.6), the zero-bubble paper's profiled 1.5B model (ms);
- ``comm-heavy``: (1, 1, 1, 0.5); ``W-light``: (1, 1, 0.5, 0.05); ``B-heavy``: (1, 1.5, 1, 0.1);
- ``first+30%,last x2``: the 1.5B profile with the first stage 1.3x (embedding) and the last 2x (LM head);
- ``ramp 0.8-1.2``: the 1.5B profile scaled linearly from 0.8x on the first stage to 1.2x on the last.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from bubbleless_schedules import Costs

RANKS = (2, 4, 8, 16, 32)
BASE = {
    "unit": (1.0, 1.0, 1.0, 0.0),
    "1.5B": (18.5, 18.1, 9.3, 0.6),
    "comm-heavy": (1.0, 1.0, 1.0, 0.5),
    "W-light": (1.0, 1.0, 0.5, 0.05),
    "B-heavy": (1.0, 1.5, 1.0, 0.1),
}
HETEROGENEOUS = ("first+30%,last x2", "ramp 0.8-1.2")
PROFILES = (*BASE, *HETEROGENEOUS)


def microbatch_counts(p: int) -> tuple[int, ...]:
    return tuple(dict.fromkeys((p, 2 * p, 3 * p + 1, 4 * p, 8 * p)))


def memory_limits(p: int) -> tuple[float, ...]:
    """V-Min's, V-Half's, 1F1B's, 1.5x and ZB-H2's 2p, in M_B, duplicates dropped."""
    return tuple(dict.fromkeys(float(x) for x in ((p + 4) // 3, (p + 2) // 2, p, math.floor(1.5 * p), 2 * p)))


def stage_factors(name: str, num_stages: int) -> list[float]:
    if name == "first+30%,last x2":
        factors = [1.0] * num_stages
        factors[0] *= 1.3
        factors[-1] *= 2.0
        return factors
    if name == "ramp 0.8-1.2":
        if num_stages == 1:
            return [1.0]
        return [0.8 + 0.4 * s / (num_stages - 1) for s in range(num_stages)]
    raise ValueError(f"{name!r} is not a heterogeneous profile; those are {HETEROGENEOUS}")


def costs_for(name: str, num_stages: int | None = None, stages_per_rank: float = 1.0) -> Costs:
    """The profile ``name`` as ``Costs``; heterogeneous ones need ``num_stages`` (one value per stage)."""
    if name in BASE:
        return Costs(*BASE[name])
    if num_stages is None:
        raise ValueError(f"the heterogeneous profile {name!r} needs num_stages")
    f, i, w, c = BASE["1.5B"]
    factors = stage_factors(name, num_stages)
    return Costs(*([x / stages_per_rank * k for k in factors] for x in (f, i, w)), c)


class Case(NamedTuple):
    p: int
    m: int
    costs_name: str
    costs: Costs
    memory_limit: float


QUICK = ((2, 4), (4, 4), (4, 13), (8, 8), (8, 25))
"""(p, m) of the quick subset: the shapes where the issue measured the largest gaps, kept small."""


def cases(
    *,
    ps: Iterable[int] | None = None,
    ms: Iterable[int] | None = None,
    profiles: Iterable[str] | None = None,
    limits: Iterable[float] | None = None,
    quick: bool = False,
) -> Iterator[Case]:
    """Every grid case, narrowed by the given p's, m's, profile names and limits (in M_B).

    ``ms`` and ``limits`` may also be callables of p (``ms=lambda p: (p, 2 * p)``); ``quick`` keeps only
    the ``QUICK`` shapes.
    """
    profiles = tuple(PROFILES if profiles is None else profiles)
    unknown = set(profiles) - set(PROFILES)
    if unknown:
        raise ValueError(f"unknown cost profiles {sorted(unknown)}; known: {PROFILES}")
    for p in RANKS if ps is None else ps:
        shape_ms = microbatch_counts(p) if ms is None else (ms(p) if callable(ms) else ms)
        for m in shape_ms:
            if quick and (p, m) not in QUICK:
                continue
            for name in profiles:
                costs = costs_for(name, p)
                for limit in memory_limits(p) if limits is None else (limits(p) if callable(limits) else limits):
                    yield Case(p, m, name, costs, float(limit))
