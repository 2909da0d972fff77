"""The `bubbleless-schedules` command: show, compare, list, and exit status 2 with a clear message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bubbleless_schedules import Schedule, available, generate
from bubbleless_schedules.cli import compare_rows, main


def run(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def fail(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    return capsys.readouterr().err


def test_list_names_every_registered_schedule(capsys):
    out = run(capsys, "list")
    assert [line.split()[0] for line in out.splitlines()] == available()


def test_show_prints_grid_timeline_and_summary_and_writes_files(capsys, tmp_path):
    csv, trace = tmp_path / "s.csv", tmp_path / "s.json"
    out = run(capsys, "show", "1f1b", "-p", "4", "-m", "8", "--costs", "2,2,1,0.5", "--width", "60",
              "--csv", str(csv), "--trace", str(trace))
    assert "worker 3:" in out and "3B7" in out  # the grid
    rows = [line for line in out.splitlines() if line.startswith("rank ")]
    # two bands of 60 columns (each F keeps room for its label): the 4 ranks twice
    assert len(rows) == 8 and all(len(r) == len("rank 0 ") + 60 for r in rows)
    assert "makespan" in out and "peak memory 4 M_B" in out
    assert Schedule.from_csv(csv) == generate("1f1b", num_ranks=4, num_microbatches=8)
    assert json.loads(trace.read_text())["traceEvents"]


def test_show_png(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the [plot] extra is not installed")
    png = tmp_path / "s.png"
    run(capsys, "show", "gpipe", "-p", "2", "-m", "3", "--png", str(png), "--width", "40")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_ranks_best_first_and_lists_refusals(capsys):
    out = run(capsys, "compare", "-p", "4", "-m", "8", "--memory-limit", "4")
    assert "1f1b" in out
    assert "gpipe" in out and "cannot run" in out  # gpipe needs 8 M_B
    ran, refused = compare_rows(4, 8, None, 4)
    spans = [t.makespan for _, t in ran]
    assert spans == sorted(spans)
    assert "gpipe" in dict(refused) and all(t.max_peak_memory <= 4 for _, t in ran)
    assert {name for name, _ in ran} | set(dict(refused)) == set(available())
    ranked = [line.split()[1] for line in out.splitlines() if line[:2].strip().isdigit()]
    assert ranked == [name for name, _ in ran]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["show", "no-such", "-p", "2", "-m", "2"], "unknown schedule 'no-such'"),
        (["show", "1f1b", "-p", "0", "-m", "2"], "must be a whole number of at least 1"),
        (["compare", "-p", "2", "-m", "x"], "must be a whole number of at least 1"),
        (["show", "1f1b", "-p", "2", "-m", "2", "--costs", "1,2"], "--costs takes F,I,W or F,I,W,C"),
        (["show", "gpipe", "-p", "2", "-m", "4", "--memory-limit", "2"], "raise the limit to at least 4"),
        (["show", "1f1b", "-p", "2", "-m", "2", "--memory-limit", "-1"], "must be a positive number"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_input_exits_2_with_the_reason(capsys, argv, message):
    assert message in fail(capsys, *argv)


def test_installed_entry_point_runs():
    exe = shutil.which("bubbleless-schedules") or str(
        __import__("pathlib").Path(sys.executable).with_name("bubbleless-schedules")
    )
    if not __import__("os").path.exists(exe):
        pytest.skip("the package is not installed with its console script")
    done = subprocess.run([exe, "show", "nope", "-p", "2", "-m", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown schedule 'nope'" in done.stderr


PLUGIN = '''
from bubbleless_schedules import Schedule, generate, register


@register("my-gpipe")
def my_gpipe(*, num_ranks, num_microbatches, costs, memory_limit):
    built = generate("gpipe", num_ranks=num_ranks, num_microbatches=num_microbatches)
    return Schedule(built.actions, num_stages=built.num_stages, num_microbatches=num_microbatches,
                    stage_to_rank=built.stage_to_rank, name="my-gpipe")
'''


def test_import_adds_a_users_registered_schedule_to_every_command(tmp_path):
    (tmp_path / "my_schedules.py").write_text(PLUGIN)

    def cli(*argv):  # a fresh interpreter: registering here would change the registry of every later test
        return subprocess.run([sys.executable, "-m", "bubbleless_schedules.cli", *argv], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    listed = cli("--import", "my_schedules", "list")
    assert listed.returncode == 0 and "my-gpipe" in listed.stdout.split(), listed.stderr
    shown = cli("--import", "my_schedules", "show", "my-gpipe", "-p", "2", "-m", "2")
    assert shown.returncode == 0 and "makespan" in shown.stdout, shown.stderr
    compared = cli("--import", "my_schedules", "compare", "-p", "2", "-m", "2")
    assert compared.returncode == 0 and "my-gpipe" in compared.stdout, compared.stderr
    assert "my-gpipe" not in cli("list").stdout.split()  # only with --import
    missing = cli("--import", "no_such_module", "list")
    assert missing.returncode == 2 and "--import no_such_module: cannot import it" in missing.stderr
