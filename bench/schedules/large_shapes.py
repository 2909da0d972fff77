"""The issue-11 grid at the shapes compare.py leaves out by default: p=32 with m >= 128 (m = 4p and 8p).

    python -m bench.schedules.large_shapes              # both m, every profile (about 30 min CPU)
    python -m bench.schedules.large_shapes --m 128      # one m

Same comparison as sections (f) and (g) of compare.py (ours / best independent reference under the same
memory limit, above 1.000 fails), over the rows those sections skip. ``auto`` is left out, as compare.py
leaves it out above p=8: it runs every other generator, whose rows are here. Each table says how long
it took, so the cost of folding these shapes into compare.py is on record.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.schedules import compare, v_family
from bench.schedules.grid import PROFILES, cases, costs_for, microbatch_counts

P = 32
LARGE_MS = tuple(m for m in microbatch_counts(P) if m > 2 * P)


def zb_cases(ms):
    """(name, case, ours, reference, which) for zb-h1, zb-h2 and zb at p=32 and ``ms``."""
    found = []
    for case in cases(ps=(P,), ms=ms):
        for name in ("zb-h1", "zb-h2", "zb"):
            refs = compare._zb_refs(name, case.p, case.memory_limit)
            if refs is None:
                continue
            ref = compare.zb_best_reference(name, case, refs)
            if ref is None:
                continue
            limit = None if name in ("zb-h1", "zb-h2") else case.memory_limit
            ours = compare.simulate(compare.generate(name, num_ranks=case.p, num_microbatches=case.m,
                                                     costs=case.costs, memory_limit=limit), case.costs).makespan
            found.append((name, case, ours, ref[0], ref[1]))
    return found


def v_cases(ms):
    """``v_family.Case`` for zbv, v-half, v-min and dualpipev at p=32 and ``ms``."""
    found = []
    for name in v_family.NAMES:
        for m in ms:
            for profile in PROFILES:
                true = costs_for(profile, 2 * P, 2)
                for limit in v_family.effective_limits(name, P):
                    ref = v_family.best_reference(name, P, m, profile, limit)
                    if ref is None:
                        continue
                    ours = compare.simulate(compare.generate(name, num_ranks=P, num_microbatches=m, costs=true,
                                                             memory_limit=limit), true).makespan
                    found.append(v_family.Case(name, profile, P, m, limit, ours, ref[0], ref[1]))
    return found


def v_rows(found) -> list[v_family.Row]:
    import math
    from collections import defaultdict

    groups = defaultdict(list)
    for case in found:
        groups[(case.name, case.profile, f"p={case.p} m={case.m}")].append(case)
    rows = []
    for (name, profile, group), items in groups.items():
        ratios = [c.ratio for c in items]
        fails = tuple(f"limit={c.limit:g}: {c.ratio:.4f} ({c.which})" for c in items if c.ratio > 1 + 1e-9)
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        rows.append(v_family.Row(name, profile, group, len(items), max(ratios), geo, fails))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="*", default=list(LARGE_MS), help=f"micro-batches (default {LARGE_MS})")
    args = parser.parse_args(argv)
    failures = 0
    start = time.process_time()
    zb = zb_cases(tuple(args.m))
    rows = compare.ratio_rows(zb)
    print(f"### ZB family, p={P} m in {args.m} ({len(zb)} cases, {time.process_time() - start:.0f} s CPU)\n")
    print(compare.table(["generator", "costs", "shapes", "cases", "worst", "geomean", "slower cases"], rows))
    failures += sum(r[-1] != "-" for r in rows)
    start = time.process_time()
    v = v_cases(tuple(args.m))
    rows = v_rows(v)
    print(f"\n### V family, p={P} m in {args.m} ({len(v)} cases, {time.process_time() - start:.0f} s CPU)\n")
    print(v_family.markdown(rows))
    failures += sum(bool(r.failures) for r in rows)
    print(f"\n{failures} rows above 1.000")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
