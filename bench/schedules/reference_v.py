"""The V-family REFERENCE table for ``compare.py``: the independent published references, one callable each.

This file used to hold fixed V orders that repeated our own zbv order and shared our block code (issue
11 called it out); it is retired in favour of ``published_v.py`` and ``published_v_zbv.py``, written
from the reference page alone. What is left is the adapter ``compare.py`` expects:
``REFERENCE[name](*, num_ranks, num_microbatches, costs, memory_limit) -> Schedule``, the fastest under
``costs`` of the published algorithms of that name (see ``v_family.references``) within the memory
limit, capped at the name's own design peak (v-half without a limit is still V-Half). Raises
ValueError when none fits.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bubbleless_schedules import Costs, Schedule, peak_memory, simulate

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.schedules.v_family import CAP, NAMES, references  # noqa: E402


def _best(name: str):
    def build(*, num_ranks: int, num_microbatches: int, costs: Costs | None = None,
              memory_limit: float | None = None) -> Schedule:
        p, m, costs = num_ranks, num_microbatches, costs or Costs.unit()
        cap = float(CAP[name](p))
        limit = cap if memory_limit is None or name == "dualpipev" else min(cap, float(memory_limit))
        if memory_limit is not None and name == "dualpipev" and memory_limit < cap:
            raise ValueError(f"reference dualpipev needs {cap:g} M_B, above memory_limit={memory_limit:g}")
        best = None
        for _label, fn in references(name):
            try:
                schedule = fn(p, m, costs, limit)
            except ValueError:
                continue
            if max(peak_memory(schedule)) > limit + 1e-9:
                continue
            span = simulate(schedule, costs).makespan
            if best is None or span < best[0] - 1e-9:
                best = (span, schedule.replace(name=f"ref-{name}"))
        if best is None:
            raise ValueError(f"no published {name} reference fits {limit:g} M_B at p={p}, m={m}")
        return best[1]

    return build


REFERENCE = {name: _best(name) for name in NAMES}
