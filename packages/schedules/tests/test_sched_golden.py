"""Every registered generator still produces its golden schedules (tests/golden/<name>/p<P>-m<M>.csv).

A generator without a golden folder yet is skipped (new algorithms land before their files); a folder
for a name no longer registered fails, so stale files do not linger. Regenerate after an intended
change with `nox -s golden` (python -m bubbleless_schedules.golden packages/schedules/tests/golden).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from bubbleless_schedules import available
from bubbleless_schedules.golden import SHAPES, golden_text, shape_file

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = "regenerate with `nox -s golden` (python -m bubbleless_schedules.golden packages/schedules/tests/golden)"


def _diff(expected: str, actual: str, path: Path) -> str:
    lines = difflib.unified_diff(
        expected.splitlines(), actual.splitlines(), fromfile=f"{path} (golden)", tofile="generate() today", lineterm=""
    )
    return "\n".join(list(lines)[:40])


@pytest.mark.parametrize("name", available())
def test_generator_matches_golden_files(name):
    if not (GOLDEN / name).is_dir():
        pytest.skip(f"no golden files for {name!r} yet; {REGENERATE}")
    for p, m in SHAPES:
        path = shape_file(GOLDEN, name, p, m)
        actual = golden_text(name, p, m)
        if not path.exists():
            assert actual is None, f"{name} now supports p={p} m={m} but has no golden file {path}; {REGENERATE}"
            continue
        assert actual is not None, f"{name} no longer generates p={p} m={m} (golden file {path}); {REGENERATE}"
        expected = path.read_text()
        assert actual == expected, f"{name} p={p} m={m} differs from its golden file; {REGENERATE}\n" + _diff(
            expected, actual, path
        )


def test_golden_files_belong_to_registered_schedules():
    assert GOLDEN.is_dir(), f"missing {GOLDEN}; {REGENERATE}"
    registered = set(available())
    stale = sorted(folder.name for folder in GOLDEN.iterdir() if folder.is_dir() and folder.name not in registered)
    assert not stale, f"golden files exist for schedules no longer registered: {stale}; {REGENERATE}"
    shapes = {f"p{p}-m{m}.csv" for p, m in SHAPES}
    odd = sorted(str(f.relative_to(GOLDEN)) for f in GOLDEN.glob("*/*.csv") if f.name not in shapes)
    assert not odd, f"golden files for shapes no longer in golden.SHAPES: {odd}; {REGENERATE}"


def test_golden_files_load_back_as_schedules():
    from bubbleless_schedules import Schedule, validate

    files = sorted(GOLDEN.glob("*/*.csv"))
    assert files, f"no golden files at all under {GOLDEN}; {REGENERATE}"
    for path in files:
        schedule = Schedule.from_csv(path)
        if path.parent.name == "auto":  # auto hands back the winner under its own name
            assert schedule.name in available()
        else:
            assert schedule.name == path.parent.name
        validate(schedule)
