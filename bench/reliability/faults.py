"""Fault injection for issue 9: no hangs, no orphans, no checkpoint lost or mistaken, exact resumes.

    python bench/reliability/faults.py [--runs 3] [--out bench/results/reliability.md]   (nox -s bench_reliability)

One uninterrupted ``bubbleless train`` run is the reference (3 CPU ranks, 1f1b, a checkpoint after
every step). Then, ``--runs`` times each, a run of the same config gets one fault at a random step:

- ``kill-rank``: SIGKILL one rank; ``stop-rank``: SIGSTOP one rank (``pipeline.timeout`` 5 s);
- ``kill-launcher``: SIGKILL the launcher; ``term-launcher``: SIGTERM it (save, then exit 143);
- ``kill-in-write``: SIGKILL every process of the run the moment a checkpoint's ``.partial``
  directory appears (whether the kill landed inside the write is counted);

and is then resumed with ``--resume latest``. Recorded per scenario: hangs (the launcher not gone within
its bound), orphans (processes carrying the run's marker still alive 10 s after), headlines that do not
name the rank and how, checkpoints lost (the newest complete one before the fault gone) or mistaken (a
``checkpoint-N`` that does not load, checksums verified), and resumes whose per-step losses
(``metrics.jsonl``) and final checkpoint are bit-identical to the reference. ``pool_faults`` adds the
round-robin pool's cases. The record goes to ``--out`` with the machine, versions and config.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pool_faults  # noqa: E402

from bubbleless_runtime._testing import procs  # noqa: E402

STEPS = 40
TIMEOUT = 5
CONFIG = f"""\
model: {{vocab_size: 16, hidden_size: 128, intermediate_size: 256, num_layers: 4, num_heads: 4, num_kv_heads: 2,
        head_dim: 32}}
data: {{task: copy, num_symbols: 8, length: 4, batch_size: 8}}
pipeline: {{schedule: 1f1b, nproc: 3, num_microbatches: 4, timeout: {TIMEOUT}}}
optimizer: {{lr: 1.0e-2, warmup_steps: 2}}
train: {{steps: {STEPS}, save_every: 1, checkpoint: true, keep_checkpoints: 2}}
"""
SCENARIOS = ("kill-rank", "stop-rank", "kill-launcher", "term-launcher", "kill-in-write")


class Run(subprocess.Popen):
    """A ``bubbleless train`` process whose stdout and stderr are read as it runs (a full pipe would
    block it), so waiting for it measures its own exit, not when the last holder of its pipes closes."""

    def __init__(self, command, **kwargs) -> None:
        super().__init__(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        self._chunks: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(pipe, self._chunks[key]), daemon=True)
                         for key, pipe in (("out", self.stdout), ("err", self.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe, chunks) -> None:
        for line in pipe:
            chunks.append(line)

    def stderr_text(self, wait: float = 15.0) -> str:
        for reader in self._readers:
            reader.join(wait)
        return "".join(self._chunks["err"])


def start(config: Path, out: Path, run: str, *extra) -> Run:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", procs.MARKER: run}
    command = [sys.executable, "-c", "from bubbleless_runtime.cli import main; raise SystemExit(main())", "train",
               str(config), "--output-dir", str(out), *extra]
    return Run(command, env=env, start_new_session=True)


def steps_done(out: Path) -> int:
    try:
        return sum(1 for line in (out / "metrics.jsonl").read_text().splitlines() if line.endswith("}"))
    except OSError:
        return 0


def losses(out: Path) -> list[float]:
    from bubbleless_runtime.metrics import read_metrics

    return [r["loss"] for r in read_metrics(out)]


def state_of(directory: Path, world: int) -> list[dict]:
    """Every rank's state, checksums verified (ValueError when incomplete or corrupt)."""
    from bubbleless_runtime import checkpoint_files as files
    from bubbleless_runtime.checkpoint_state import read

    manifest = files.check_complete(str(directory))
    return [read(files.verify_file(str(directory), f"rank{r:05d}.safetensors", manifest),
                 files.verify_file(str(directory), f"rank{r:05d}.json", manifest)) for r in range(world)]


def identical(a: list[dict], b: list[dict]) -> bool:
    import torch

    def same(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
        return x == y

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def complete_steps(out: Path) -> list[int]:
    from bubbleless_runtime import checkpoint_files as files

    return [step for step, _ in files.complete_checkpoints(str(out))]


@dataclass
class Tally:
    runs: int = 0
    hangs: int = 0
    orphans: int = 0
    headline_wrong: int = 0
    lost: int = 0
    mistaken: int = 0
    reproduced: int = 0
    in_write: int = 0
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def inject(name: str, proc: subprocess.Popen, out: Path, rng: random.Random) -> tuple[int | None, float]:
    """Apply fault ``name``; returns (the rank index hit or None, the moment of the fault)."""
    ranks = procs.ranks_of(proc.pid)
    if name in ("kill-rank", "stop-rank"):
        index = rng.randrange(len(ranks))
        os.kill(ranks[index], signal.SIGKILL if name == "kill-rank" else signal.SIGSTOP)
        return index, time.monotonic()
    if name == "kill-launcher":
        os.kill(proc.pid, signal.SIGKILL)
    elif name == "term-launcher":
        os.kill(proc.pid, signal.SIGTERM)
    elif name == "kill-in-write":
        end = time.monotonic() + 60
        while time.monotonic() < end and not any(n.endswith(".partial") for n in os.listdir(out)):
            time.sleep(0.0005)
        procs.kill_all([proc.pid, *ranks])
    return None, time.monotonic()


def expected_headline(name: str, index: int | None) -> re.Pattern | None:
    return {
        "kill-rank": re.compile(rf"bubbleless: rank {index} was killed by SIGKILL without reporting a result"),
        "stop-rank": re.compile(rf"bubbleless: rank {index} stopped responding: .*stopped \(SIGSTOP"),
        "term-launcher": re.compile(r"bubbleless: stopped by SIGTERM after step \d+ of \d+: checkpoint saved at"),
    }.get(name)


def one_run(name: str, config: Path, work: Path, reference: tuple, rng: random.Random, tally: Tally) -> None:
    run = uuid.uuid4().hex
    out = work / f"{name}-{tally.runs}"
    tally.runs += 1
    proc = start(config, out, run)
    target = rng.randrange(3, STEPS - 8)
    end = time.monotonic() + 300
    while steps_done(out) < target and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.002)
    if proc.poll() is not None:
        tally.notes.append(f"{out.name}: ended before the fault (exit {proc.returncode}): {proc.stderr_text()[-300:]}")
        return
    before = complete_steps(out)
    index, at = inject(name, proc, out, rng)
    bound = TIMEOUT + 30 if name == "stop-rank" else 30
    try:
        proc.wait(timeout=bound)  # the launcher's own exit; its pipes are read meanwhile (see start)
    except subprocess.TimeoutExpired:
        tally.hangs += 1
        procs.kill_all(procs.marked(run))
        proc.wait()
    tally.seconds.append(time.monotonic() - at)
    err = proc.stderr_text()
    left = procs.marked(run)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = procs.marked(run)
    if left:
        tally.orphans += len(left)
        procs.kill_all(left)
    if name == "kill-in-write" and any(n.endswith(".partial") for n in os.listdir(out)):
        tally.in_write += 1
    pattern = expected_headline(name, index)
    lines = [line for line in err.splitlines() if line.startswith("bubbleless: ")]  # not a helper's warnings
    if pattern is not None and not (lines and pattern.search(lines[-1])):
        tally.headline_wrong += 1
        tally.notes.append(f"{out.name}: headline {lines[-1][:200] if lines else '(none)'!r}")
    after = complete_steps(out)
    if before and (not after or after[-1] < before[-1]):
        tally.lost += 1
    for name_ in os.listdir(out):
        if name_.startswith("checkpoint-"):
            try:
                state_of(out / name_, 3)
            except ValueError as error:
                tally.mistaken += 1
                tally.notes.append(f"{out.name}/{name_}: {error}")
    resumed = start(config, out, run, "--resume", "latest")
    resumed.wait(timeout=600)
    err = resumed.stderr_text()
    want_losses, want_state = reference
    if resumed.returncode == 0 and losses(out) == want_losses and identical(state_of(out / f"checkpoint-{STEPS}", 3),
                                                                            want_state):
        tally.reproduced += 1
    else:
        tally.notes.append(f"{out.name}: resume exit {resumed.returncode}, losses equal "
                           f"{losses(out) == want_losses}: {err[-300:]}")


def record(path: Path, tallies: dict[str, Tally], pool: list[dict], args, started: str, load: tuple) -> None:
    import torch

    from bubbleless_runtime import __version__

    rows = []
    for name, t in tallies.items():
        secs = f"{statistics.median(t.seconds):.1f} / {max(t.seconds):.1f}" if t.seconds else "-"
        extra = f" ({t.in_write} of {t.runs} inside a write)" if name == "kill-in-write" else ""
        rows.append(f"| {name}{extra} | {t.runs} | {t.hangs} | {t.orphans} | {t.headline_wrong} | {t.lost} | "
                    f"{t.mistaken} | {t.reproduced} of {t.runs} | {secs} |")
    pool_rows = [f"| {c['case']} | {c['runs']} | {c['hangs']} | {c['clear']} of {c['runs']} | "
                 f"{c['recovered']} of {c['runs']} | {c['threads_left']} | {c['message']} |" for c in pool]
    notes = [f"- {n}" for t in tallies.values() for n in t.notes] or ["- none"]
    text = "\n".join([
        "# Reliability under faults (issue 9)",
        "",
        f"Generated by `nox -s bench_reliability` (`python bench/reliability/faults.py --runs {args.runs} "
        f"--seed {args.seed}`); do not edit by hand.",
        "",
        f"Run {started} on {platform.platform()}, {os.cpu_count()} CPUs, load average {load[0]:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after (a machine shared with other engineers' work), Python "
        f"{platform.python_version()}, torch {torch.__version__}, bubbleless-runtime {__version__}, {_commit()}.",
        "",
        "## `bubbleless train`: one fault per run, then `--resume latest`",
        "",
        "Config (every run, the reference included):",
        "",
        "```yaml", CONFIG.rstrip(), "```",
        "",
        "Columns: hangs, the launcher still running 30 s after the fault (stop-rank: timeout + 30 s); orphans,",
        "processes with the run's marker alive 10 s after the launcher ended; headline wrong, the last",
        "`bubbleless:` line of stderr not naming the rank and how (kill-rank, stop-rank) or the saved checkpoint",
        "(term-launcher); lost, the newest complete checkpoint before the fault gone afterwards; mistaken, a",
        "`checkpoint-N` directory that does not load with checksums verified; reproduced, the resumed run's",
        "per-step losses (`metrics.jsonl`) and every rank's final checkpoint bit-identical to the uninterrupted",
        "run's; seconds, from the fault to the launcher's exit, median / max (measured, not a goal; the machine",
        "is shared, see the load above).",
        "",
        "| fault | runs | hangs | orphans | headline wrong | checkpoints lost | mistaken | resumes reproduce | "
        "seconds to exit |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Notes:",
        "",
        *notes,
        "",
        "## Round-robin pool (`RoundRobinPipeline`, 4 CPU devices, in this process)",
        "",
        "Each case runs a step with the fault, then a step without it. Columns: hangs, the step not returning",
        "within 60 s; clear, the error raised is the expected type with the expected text; recovered, the next",
        "step's gradients match the unpipelined model (relative error <= 1e-5) or, for a refused plan, a",
        "plan that fits builds and runs; threads left, pool threads alive after the pipeline is dropped.",
        "",
        "| case | runs | hangs | clear error | recovered | threads left | the error |",
        "|---|---|---|---|---|---|---|",
        *pool_rows,
        "",
    ])
    path.write_text(text)


def _commit() -> str:
    """The commit measured: ``BUBBLELESS_COMMIT`` (a run from an export of it), else git's HEAD here."""
    if os.environ.get("BUBBLELESS_COMMIT"):
        return f"commit {os.environ['BUBBLELESS_COMMIT']} (a clean export of it)"
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "packages"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    return f"commit {head}" + (" (package files modified in the tree)" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fault (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault steps and ranks")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--out", type=Path, default=Path("bench/results/reliability.md"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bubbleless-faults-") as tmp:
        work = Path(tmp)
        config = work / "run.yaml"
        config.write_text(CONFIG)
        ref = start(config, work / "reference", uuid.uuid4().hex)
        ref.wait(timeout=900)
        err = ref.stderr_text()
        if ref.returncode != 0:
            print(err[-3000:], file=sys.stderr)
            return 1
        reference = (losses(work / "reference"), state_of(work / "reference" / f"checkpoint-{STEPS}", 3))
        tallies = {}
        for name in args.scenarios:
            tallies[name] = Tally()
            for _ in range(args.runs):
                one_run(name, config, work, reference, rng, tallies[name])
                print(name, tallies[name], flush=True)
    pool = pool_faults.run_all(args.runs, rng)
    record(args.out, tallies, pool, args, started, load)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
