"""V family (zbv, v-half, v-min, dualpipev): ours against the independent published references.

    python bench/schedules/v_family.py            # p in {2, 4, 8, 16}, p=32 at m <= 2p
    python bench/schedules/v_family.py --quick    # grid.QUICK shapes only
    python bench/schedules/v_family.py --full     # every grid shape, p=32 m=256 included (minutes)

``comparison_rows(...)`` returns one ``Row`` per (generator, cost profile, shape group): ours / best
reference (worst and geomean over shapes and memory limits) and the cases where ours is slower;
``bench/schedules/compare.py`` imports it. References (``published_v.py``, ``published_v_zbv.py``)
are built from the reference page only; each named generator is compared with every published
algorithm of that name under the same memory limit (a grid limit above the name's own cap is the
cap: v-half at 2p is still V-Half), the best of them taken:

- zbv: handcrafted ZB-V (where p M_B fits), sail-sg's greedy zbv, the PCM block search (V-ZB);
- v-half / v-min: the PCM block search and sail-sg's greedy V-Half / V-Min (where its peak fits);
- dualpipev: DeepSeek's DualPipeV order (limits >= p + 1/2 only).

Heterogeneous profiles: the references schedule with the median per-stage costs (as upstream does)
and are timed with the true ones; ours gets the true costs.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.schedules import published_v, published_v_zbv  # noqa: E402
from bench.schedules.grid import HETEROGENEOUS, PROFILES, RANKS, costs_for, memory_limits, microbatch_counts  # noqa: E402
from bubbleless_schedules import Costs, generate, peak_memory, simulate  # noqa: E402

NAMES = ("zbv", "v-half", "v-min", "dualpipev")
CAP = {"zbv": lambda p: p, "v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3,
       "dualpipev": lambda p: p + 0.5}
EPS = 1e-9


def references(name: str):
    """(label, fn(p, m, costs, limit) -> Schedule) of the published algorithms named ``name``."""
    block = ("pcm-block", published_v.block_search)
    if name == "zbv":
        return [("zbv-handcrafted", published_v_zbv.handcrafted_zbv), ("zbv-greedy", published_v_zbv.greedy_zbv),
                block]
    if name in ("v-half", "v-min"):
        return [block, (f"greedy-{name}", lambda p, m, c, lim: published_v.greedy(p, m, c, lim, name))]
    return [("dualpipev-published", published_v_zbv.dualpipev)]


def effective_limits(name: str, p: int) -> list[float]:
    """The grid's limits as they bind ``name``: capped at its design peak, duplicates dropped."""
    if name == "dualpipev":
        return [float(p) + 0.5] if any(lim >= p + 0.5 for lim in memory_limits(p)) else []
    return sorted({min(lim, float(CAP[name](p))) for lim in memory_limits(p) if lim >= 1})


_cache: dict = {}


def best_reference(name: str, p: int, m: int, profile: str, limit: float) -> tuple[float, str] | None:
    """(makespan under the true costs, which reference) of the fastest published algorithm fitting
    ``limit``, or None when none applies."""
    true = costs_for(profile, 2 * p, 2)
    steer = true.median() if profile in HETEROGENEOUS else true
    best = None
    for label, fn in references(name):
        key = (label, p, m, profile, limit)
        if key not in _cache:
            try:
                schedule = fn(p, m, steer, limit)
                ok = max(peak_memory(schedule)) <= limit + EPS
                _cache[key] = simulate(schedule, true).makespan if ok else None
            except ValueError:
                _cache[key] = None
        span = _cache[key]
        if span is not None and (best is None or span < best[0] - EPS):
            best = (span, label)
    return best


class Case(NamedTuple):
    name: str
    profile: str
    p: int
    m: int
    limit: float
    ours: float
    reference: float
    which: str

    @property
    def ratio(self) -> float:
        return self.ours / self.reference


class Row(NamedTuple):
    generator: str
    profile: str
    group: str
    cases: int
    worst: float
    geomean: float
    failures: tuple[str, ...]
    """``p=.. m=.. limit=..: ratio (reference)`` for every case above 1.000."""


def shapes(quick: bool, full: bool) -> list[tuple[int, int]]:
    from bench.schedules.grid import QUICK

    if quick:
        return list(QUICK)
    out = []
    for p in RANKS:
        for m in microbatch_counts(p):
            if p == 32 and not full and m > 2 * p:
                continue
            out.append((p, m))
    return out


def compare_cases(names=NAMES, profiles=PROFILES, quick: bool = False, full: bool = False) -> list[Case]:
    found = []
    for name in names:
        for p, m in shapes(quick, full):
            for profile in profiles:
                true = costs_for(profile, 2 * p, 2)
                for limit in effective_limits(name, p):
                    ref = best_reference(name, p, m, profile, limit)
                    if ref is None:
                        continue
                    try:
                        ours = simulate(generate(name, num_ranks=p, num_microbatches=m, costs=true,
                                                 memory_limit=limit), true).makespan
                    except ValueError:
                        ours = math.inf
                    found.append(Case(name, profile, p, m, limit, ours, ref[0], ref[1]))
    return found


def group_of(p: int) -> str:
    return "p<=4" if p <= 4 else f"p={p}"


def comparison_rows(names=NAMES, profiles=PROFILES, quick: bool = False, full: bool = False) -> list[Row]:
    """One row per generator, cost profile and shape group (p<=4, p=8, p=16, p=32)."""
    return rows_of(compare_cases(names, profiles, quick, full))


def rows_of(cases: list[Case]) -> list[Row]:
    """``comparison_rows`` from cases already compared (e.g. each generator's in its own process)."""
    groups: dict[tuple, list[Case]] = defaultdict(list)
    for case in cases:
        groups[(case.name, case.profile, group_of(case.p))].append(case)
    rows = []
    for (name, profile, group), found in groups.items():
        ratios = [c.ratio for c in found]
        fails = tuple(f"p={c.p} m={c.m} limit={c.limit:g}: {c.ratio:.4f} ({c.which})"
                      for c in found if c.ratio > 1 + 1e-9)
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if all(r < math.inf for r in ratios) else math.inf
        rows.append(Row(name, profile, group, len(found), max(ratios), geo, fails))
    return rows


def closed_form_rows() -> list[tuple[str, str, float, float]]:
    """(what, shape, ours, closed form) at unit costs."""
    unit = Costs.unit()
    out = []
    for p, m in ((4, 8), (8, 16), (4, 12)):
        zbv = simulate(generate("zbv", num_ranks=p, num_microbatches=m)).bubble_rate
        out.append(("zbv bubble (p-1)/(6m+p-1)", f"p={p} m={m}", zbv, (p - 1) / (6 * m + p - 1)))
        for name, cap in (("v-half", (p + 2) // 2), ("v-min", (p + 4) // 3)):
            big_m = 2 * cap
            b = 3 * p - 1 - 3 * big_m + max(3 * p, p + 1 + 2 * ((big_m + 1) // 2))
            tl = simulate(generate(name, num_ranks=p, num_microbatches=m), unit)
            out.append((f"{name} makespan 3m + b(M)/2, M={big_m}", f"p={p} m={m}", tl.makespan, 3 * m + b / 2))
    return out


def generation_times(p: int = 32, m: int = 256) -> list[tuple[str, float]]:
    out = []
    for name in NAMES:
        start = time.perf_counter()
        generate(name, num_ranks=p, num_microbatches=m, costs=Costs(18.5, 18.1, 9.3, 0.6))
        out.append((name, time.perf_counter() - start))
    return out


def markdown(rows: list[Row]) -> str:
    lines = ["| generator | costs | shapes | cases | worst ours/ref | geomean | slower cases |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (NAMES.index(r.generator), PROFILES.index(r.profile), r.group)):
        fails = "; ".join(r.failures[:3]) + (f" (+{len(r.failures) - 3})" if len(r.failures) > 3 else "")
        lines.append(f"| {r.generator} | {r.profile} | {r.group} | {r.cases} | {r.worst:.4f} | {r.geomean:.4f} | "
                     f"{fails or '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--names", nargs="*", default=list(NAMES))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = comparison_rows(tuple(args.names), quick=args.quick, full=args.full)
    print(markdown(rows))
    failures = sum(len(r.failures) for r in rows)
    print(f"\n{sum(r.cases for r in rows)} cases, {failures} slower than the best reference "
          f"({time.perf_counter() - start:.0f} s)")
    print("\n| closed form | shape | ours | closed form |\n|---|---|---|---|")
    for what, shape, ours, closed in closed_form_rows():
        print(f"| {what} | {shape} | {ours:.4f} | {closed:.4f} |")
    print("\n| generation at p=32 m=256 | seconds |\n|---|---|")
    for name, seconds in generation_times():
        print(f"| {name} | {seconds:.2f} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
