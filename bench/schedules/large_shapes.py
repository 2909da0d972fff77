"""The issue-11 grid at the shapes compare.py leaves out by default: p=32 with m > 2p (m = 3p+1, 4p, 8p).

    python -m bench.schedules.large_shapes                          # every m, generator and profile (30+ min CPU)
    python -m bench.schedules.large_shapes --m 128 --names zbv      # one piece
    python -m bench.schedules.large_shapes --record cases.jsonl     # resumable: cases already there are skipped
    python -m bench.schedules.large_shapes --record cases.jsonl --m # table the record only (no m to run)
    python -m bench.schedules.large_shapes --retime old.jsonl --names zbv --record new.jsonl  # ours again

Same comparison as sections (f) and (g) of compare.py (ours / best independent reference under the same
memory limit, above 1.000 fails), over the rows those sections skip. ``auto`` is left out, as compare.py
leaves it out above p=8: it runs every other generator, whose rows are here. The whole grid takes long
on a shared machine, so it runs in pieces (one m, generator and profile at a time); with ``--record``
each case is appended to the file as soon as it is compared, with the CPU seconds its reference and
ours took, and a rerun skips it, so an interrupted run loses at most one piece. The tables are made from
every case in the record (and this run's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from bench.schedules import compare, v_family
from bench.schedules.grid import PROFILES, cases, costs_for, microbatch_counts

P = 32
LARGE_MS = tuple(m for m in microbatch_counts(P) if m > 2 * P)
ZB_NAMES = ("zb-h1", "zb-h2", "zb")
NAMES = (*ZB_NAMES, *v_family.NAMES)


class Compared(NamedTuple):
    """One case: ours and the best reference's makespan at p=32, with the CPU seconds each side took."""

    name: str
    profile: str
    m: int
    limit: float
    ours: float
    reference: float
    which: str
    reference_seconds: float
    ours_seconds: float

    @property
    def ratio(self) -> float:
        return self.ours / self.reference


def _cpu(fn):
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


def _ours(name: str, costs, m: int, limit: float | None) -> float:
    try:
        return compare.simulate(compare.generate(name, num_ranks=P, num_microbatches=m, costs=costs,
                                                 memory_limit=limit), costs).makespan
    except ValueError:
        return math.inf


def zb_piece(name: str, m: int, profile: str) -> list[Compared]:
    """zb-h1, zb-h2 or zb at p=32, ``m`` and ``profile``, every grid limit its references apply at."""
    found = []
    for case in cases(ps=(P,), ms=(m,), profiles=(profile,)):
        refs = compare._zb_refs(name, case.p, case.memory_limit)
        if refs is None:
            continue
        ref, ref_s = _cpu(lambda: compare.zb_best_reference(name, case, refs))  # noqa: B023
        if ref is None:
            continue
        limit = None if name in ("zb-h1", "zb-h2") else case.memory_limit
        ours, ours_s = _cpu(lambda: _ours(name, case.costs, m, limit))  # noqa: B023
        found.append(Compared(name, profile, m, case.memory_limit, ours, ref[0], ref[1], ref_s, ours_s))
    return found


def v_piece(name: str, m: int, profile: str) -> list[Compared]:
    """zbv, v-half, v-min or dualpipev at p=32, ``m`` and ``profile``, every limit as it binds ``name``."""
    true = costs_for(profile, 2 * P, 2)
    found = []
    for limit in v_family.effective_limits(name, P):
        ref, ref_s = _cpu(lambda: v_family.best_reference(name, P, m, profile, limit))  # noqa: B023
        if ref is None:
            continue
        ours, ours_s = _cpu(lambda: _ours(name, true, m, limit))  # noqa: B023
        found.append(Compared(name, profile, m, limit, ours, ref[0], ref[1], ref_s, ours_s))
    return found


def piece(name: str, m: int, profile: str) -> list[Compared]:
    return (zb_piece if name in ZB_NAMES else v_piece)(name, m, profile)


def load(path: Path | None) -> list[Compared]:
    if path is None or not path.exists():
        return []
    return [Compared(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def run(names, ms, profiles, record: Path | None) -> list[Compared]:
    """Every piece of ``names`` x ``ms`` x ``profiles`` not already in ``record``, appended to it as done."""
    found = load(record)
    done = {(c.name, c.m, c.profile) for c in found}
    for m in ms:
        for name in names:
            for profile in profiles:
                if (name, m, profile) in done:
                    continue
                new = piece(name, m, profile)
                found += new
                seconds = sum(c.reference_seconds + c.ours_seconds for c in new)
                worst = max((c.ratio for c in new), default=math.nan)
                print(f"{name} m={m} {profile}: {len(new)} cases, worst {worst:.4f}, {seconds:.0f} s CPU",
                      file=sys.stderr, flush=True)
                if record is not None:
                    with record.open("a") as out:
                        out.writelines(json.dumps(c._asdict()) + "\n" for c in new)
    return found


def retimed(found: list[Compared], names) -> list[Compared]:
    """``found`` with ours re-generated for ``names`` (after a change to our generators), the recorded
    references kept: they are independent of our code, and they are most of the run's time."""
    out = []
    for c in found:
        if c.name in names:
            costs = costs_for(c.profile, P) if c.name in ZB_NAMES else costs_for(c.profile, 2 * P, 2)
            limit = None if c.name in ("zb-h1", "zb-h2") else c.limit
            ours, seconds = _cpu(lambda: _ours(c.name, costs, c.m, limit))  # noqa: B023
            c = c._replace(ours=ours, ours_seconds=seconds)
        out.append(c)
    return out


def rows(found: list[Compared]) -> list[list]:
    """[generator, costs, m, cases, worst, geomean, CPU s, slower cases] per generator, profile and m."""
    groups = defaultdict(list)
    for c in found:
        groups[(c.name, c.profile, c.m)].append(c)
    out = []
    for (name, profile, m), items in sorted(groups.items(), key=lambda kv: (NAMES.index(kv[0][0]),
                                                                          PROFILES.index(kv[0][1]), kv[0][2])):
        ratios = [c.ratio for c in items]
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if max(ratios) < math.inf else math.inf
        fails = [f"limit={c.limit:g}: {c.ratio:.4f} ({c.ours:.1f} vs {c.reference:.1f}, {c.which})"
                 for c in items if c.ratio > 1 + 1e-9]
        seconds = sum(c.reference_seconds + c.ours_seconds for c in items)
        out.append([name, profile, m, len(items), f"{max(ratios):.4f}", f"{geo:.4f}", f"{seconds:.0f}",
                    "**FAIL** " + "; ".join(fails) if fails else "-"])
    return out


def markdown(found: list[Compared]) -> str:
    table = rows(found)
    failures = [r for r in table if r[-1] != "-"]
    head = ["generator", "costs", "m", "cases", "worst", "geomean", "CPU s (ref + ours)", "slower cases"]
    ratios = [c.ratio for c in found]
    summary = (f"{len(found)} cases, worst ours/reference {max(ratios):.4f}, "
               f"{sum(c.ratio > 1 + 1e-9 for c in found)} cases above 1.000 in {len(failures)} rows.")
    return compare.table(head, table) + "\n\n" + summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="*", default=list(LARGE_MS), help=f"micro-batches (default {LARGE_MS})")
    parser.add_argument("--names", nargs="*", default=list(NAMES), choices=NAMES, help="generators (default all)")
    parser.add_argument("--profiles", nargs="*", default=list(PROFILES), choices=PROFILES,
                        help="cost profiles (default all)")
    parser.add_argument("--record", type=Path, help="JSON-lines file of compared cases: appended, and skipped on rerun")
    parser.add_argument("--retime", type=Path, help="a record whose cases of --names get ours re-generated, "
                        "references kept; the result is written to --record (nothing else is run)")
    args = parser.parse_args(argv)
    if args.retime is not None:
        found = retimed([c for c in load(args.retime) if c.m in args.m], set(args.names))
        if args.record is not None:
            args.record.write_text("".join(json.dumps(c._asdict()) + "\n" for c in found))
    else:
        found = run(args.names, args.m, args.profiles, args.record)
    if not found:
        print("no cases compared")
        return 0
    print(markdown(found))
    return 1 if any(c.ratio > 1 + 1e-9 for c in found) else 0


if __name__ == "__main__":
    sys.exit(main())
