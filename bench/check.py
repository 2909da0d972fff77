"""Regression check (issue 10, section 4): fresh figures against the baselines in bench/baselines/.

    python -m bench.check                       # deterministic figures; exit 1 on any drop
    python -m bench.check --only schedules      # one figure set (modelled, schedules, ratios)
    python -m bench.check --measured bench/results/measured.json    # also measured tokens/s
    python -m bench.check --update [--measured RUN.json ...]         # rewrite the baselines
    python -m bench.check --only modelled --update --key '* h200 x8'  # rewrite only the matching figures

A deterministic figure (bench/figures.py: modelled tokens/s and longest sequence, simulated makespans,
schedule ratios) fails on any drop at all (beyond float rounding, ``RELATIVE_EPS``); a figure that is
gone from the fresh set fails too. A measured figure fails when it drops by more than the threshold the
baseline writes down beside it, derived from the spread of repeated runs (``bench/measured_baseline.py``),
and only when the baseline was measured on the same machine. Gains and new figures pass, with a note to
run ``--update``; the baselines are sorted, indented JSON, so an update is a diff a reviewer can read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/check.py`: make `bench` importable
    sys.path.insert(0, str(ROOT))

from bench.figures import FIGURE_SETS, HIGHER, LOWER, FigureSet, KeyPatterns  # noqa: E402

BASELINES = ROOT / "bench" / "baselines"
RELATIVE_EPS = 1e-6
"""Deterministic figures are stored rounded; a change below this share is rounding, not a drop."""


@dataclass(frozen=True)
class Finding:
    name: str
    """``set/group/key``."""
    old: float | None
    new: float | None
    kind: str
    """``drop`` / ``missing`` (both fail), ``gain`` / ``new`` (both pass)."""
    threshold: float = RELATIVE_EPS

    @property
    def fails(self) -> bool:
        return self.kind in ("drop", "missing")

    def line(self) -> str:
        if self.kind == "missing":
            return f"MISSING {self.name}: baseline {self.old:g}, no fresh figure (a schedule, shape or system is gone)"
        if self.kind == "new":
            return f"new     {self.name}: {self.new:g} (not in the baseline)"
        change = (self.new - self.old) / self.old if self.old else float("inf")
        word = "DROP   " if self.kind == "drop" else "gain   "
        return f"{word} {self.name}: {self.old:g} -> {self.new:g} ({change:+.2%}; allowed {self.threshold:.2%})"


def compare(baseline: dict, fresh: dict, direction: str, *, prefix: str = "",
            thresholds: dict | None = None) -> list[Finding]:
    """Findings for one group: ``{key: value}`` baseline against fresh, ``direction`` higher/lower is better.

    ``thresholds`` (key -> relative drop allowed) defaults to ``RELATIVE_EPS`` for every key.
    """
    if direction not in (HIGHER, LOWER):
        raise ValueError(f"direction must be {HIGHER!r} or {LOWER!r}, got {direction!r}")
    findings = []
    for key in sorted(set(baseline) | set(fresh)):
        name = prefix + key
        old, new = baseline.get(key), fresh.get(key)
        if new is None:
            findings.append(Finding(name, old, None, "missing"))
            continue
        if old is None:
            findings.append(Finding(name, None, new, "new"))
            continue
        allowed = (thresholds or {}).get(key, RELATIVE_EPS)
        better = new - old if direction == HIGHER else old - new
        scale = max(abs(old), 1e-12)
        if better < -allowed * scale:
            findings.append(Finding(name, old, new, "drop", allowed))
        elif better > RELATIVE_EPS * scale:
            findings.append(Finding(name, old, new, "gain", allowed))
    return findings


def baseline_path(folder: Path, name: str) -> Path:
    return Path(folder) / f"{name}.json"


def load_baseline(folder: Path, name: str) -> dict:
    path = baseline_path(folder, name)
    if not path.exists():
        raise ValueError(f"no baseline {path}; create it with `python -m bench.check --update`")
    return json.loads(path.read_text())


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def check_set(figure_set: FigureSet, folder: Path, *, keys: set | None = None) -> list[Finding]:
    """Recompute ``figure_set`` (only ``keys`` of it, if given) and compare it with its stored baseline."""
    stored = load_baseline(folder, figure_set.name)
    fresh = figure_set.compute(keys)
    findings = []
    for group, direction in figure_set.groups.items():
        old = stored["figures"].get(group, {})
        if keys is not None:
            old = {k: v for k, v in old.items() if k in keys}
        findings += compare(old, fresh.get(group, {}), direction, prefix=f"{figure_set.name}/{group}/")
    return findings


def update_set(figure_set: FigureSet, folder: Path, *, keys=None) -> Path | None:
    """Rewrite ``figure_set``'s baseline from fresh figures; its path, or None if ``keys`` matched nothing.

    ``keys`` (a set or ``KeyPatterns``) rewrites only those: the stored figures outside them stay as they
    are, and a stored one inside them with no fresh figure is dropped, as a full update drops it."""
    path = baseline_path(folder, figure_set.name)
    figures = fresh = figure_set.compute(keys)
    if keys is not None:
        stored = load_baseline(folder, figure_set.name)["figures"]
        if not any(fresh.values()) and not any(k in keys for group in stored.values() for k in group):
            return None
        figures = {group: {**{k: v for k, v in stored.get(group, {}).items() if k not in keys}, **fresh.get(group, {})}
                   for group in figure_set.groups}
    write_json(path, {"about": figure_set.about, "directions": figure_set.groups, "figures": figures})
    return path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baselines from fresh figures")
    parser.add_argument("--baselines", type=Path, default=BASELINES, help="folder of the baseline JSON files")
    parser.add_argument("--only", action="append", choices=[s.name for s in FIGURE_SETS],
                        help="check (or update) only this deterministic set (repeatable)")
    parser.add_argument("--key", action="append", default=None, metavar="PATTERN",
                        help="check (or update) only the figures whose key matches this shell pattern, e.g. "
                             "'* h200 x8' or 'zbv qwen3-1.7b a800 x8' (repeatable); --update keeps the others")
    parser.add_argument("--measured", type=Path, nargs="+", default=None,
                        help="measured result JSON file(s) (bench.measured's output) to check or, with --update, "
                             "to write the measured baseline from (several: repeated runs)")
    parser.add_argument("--no-deterministic", action="store_true", help="only the measured check")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return _run(args)
    except ValueError as error:  # a missing baseline or run file, a --key that names no figure
        print(f"error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from bench.measured_baseline import check_measured, update_measured

    sets = [] if args.no_deterministic else [s for s in FIGURE_SETS if not args.only or s.name in args.only]
    keys = KeyPatterns(tuple(args.key)) if args.key else None
    if args.update:
        paths = [update_set(figure_set, args.baselines, keys=keys) for figure_set in sets]
        if sets and not any(paths):
            raise ValueError(f"--key {' '.join(args.key)}: matches no figure of {', '.join(s.name for s in sets)}")
        for path in filter(None, paths):
            print(f"wrote {path}" + ("" if keys is None else " (only the figures --key matches)"))
        if args.measured:
            print(f"wrote {update_measured(args.measured, args.baselines)}")
        print("review the change with `git diff bench/baselines`")
        return 0
    findings: list[Finding] = []
    for figure_set in sets:
        found = check_set(figure_set, args.baselines, keys=keys)
        counted = {k: sum(f.kind == k for f in found) for k in ("drop", "missing", "gain", "new")}
        print(f"{figure_set.name}: " + ", ".join(f"{n} {k}" for k, n in counted.items()))
        findings += found
    if args.measured:
        found, notes = check_measured(args.measured, args.baselines)
        for note in notes:
            print(f"measured: {note}")
        findings += found
    for finding in findings:
        if finding.kind != "gain" or len(findings) < 40:
            print("  " + finding.line())
    if keys is not None and sets and not findings and not any(
            key in keys for s in sets for group in load_baseline(args.baselines, s.name)["figures"].values()
            for key in group):
        raise ValueError(f"--key {' '.join(args.key)}: matches no figure of {', '.join(s.name for s in sets)}")
    failed = [f for f in findings if f.fails]
    if failed:
        print(f"bench check FAILED: {len(failed)} figure(s) dropped or missing. If the change is intended, "
              "run `python -m bench.check --update` and commit the baseline diff with the reason.")
        return 1
    if any(f.kind in ("gain", "new") for f in findings):
        print("bench check passed; some figures improved or are new: `python -m bench.check --update` records them")
    else:
        print("bench check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
