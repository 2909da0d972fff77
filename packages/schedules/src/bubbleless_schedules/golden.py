"""Golden schedule files: what every registered generator produced for a few shapes, as CSV.

``tests/test_sched_golden.py`` compares today's output with these files, so a change to any
generator's action order shows up as a failing test with the difference; when the change is intended,
regenerate them with one command::

    python -m bubbleless_schedules.golden packages/schedules/tests/golden      # or: nox -s golden

Layout: ``DIR/<schedule name>/p<ranks>-m<micro-batches>.csv``, one folder per generator, unit
costs and no memory limit. A shape a generator refuses (ValueError) simply has no file.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from .registry import available, generate

SHAPES: tuple[tuple[int, int], ...] = ((2, 4), (3, 5), (4, 8))
"""(num_ranks, num_microbatches): small, one odd, one with m = 2p, so edge cases of warm-up show."""


def shape_file(directory: str | Path, name: str, num_ranks: int, num_microbatches: int) -> Path:
    return Path(directory) / name / f"p{num_ranks}-m{num_microbatches}.csv"


def golden_text(name: str, num_ranks: int, num_microbatches: int) -> str | None:
    """The CSV ``name`` gives today for this shape, or None if the generator refuses the shape."""
    try:
        schedule = generate(name, num_ranks=num_ranks, num_microbatches=num_microbatches)
    except ValueError:
        return None
    return schedule.to_csv()


def regenerate(directory: str | Path) -> list[Path]:
    """Rewrite every golden file under ``directory``; drop files of shapes or names no longer produced."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = available()
    for folder in directory.iterdir():
        if folder.is_dir():
            for stale in folder.glob("*.csv"):
                stale.unlink()
            if folder.name not in names and not any(folder.iterdir()):
                folder.rmdir()
    written = []
    for name in names:
        for p, m in SHAPES:
            text = golden_text(name, p, m)
            if text is None:
                continue
            path = shape_file(directory, name, p, m)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m bubbleless_schedules.golden DIR   (e.g. packages/schedules/tests/golden)",
              file=sys.stderr)
        return 2
    written = regenerate(args[0])
    names = sorted({p.parent.name for p in written})
    print(f"wrote {len(written)} golden files for {len(names)} schedules under {args[0]}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
