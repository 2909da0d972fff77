"""python -m bench.measured.sweep --scenario bench/scenarios/tiny.yaml --microbatches 2,4,8

zbv against torch's Schedule1F1B as the micro-batches per step vary, the global batch fixed. A
zero-bubble schedule removes 1F1B's bubble, (p - 1) / (m + p - 1) of its step at unit costs, so what it
can gain depends on m: at p = 2 the simulator allows 1.38x at m = 2, 1.20x at m = 4 and 1.10x at m = 8.
One scenario (bench/results/measured_pipelines.md, m = 8) cannot tell a schedule that removes the bubble
from one that does not; the sweep can: the measured ratio should follow the simulated one as m grows.

Each m is a full measured run (``runner.measure``: every system in fresh processes, rounds alternating,
ratios paired round by round) with zbv-mem's cut measured for that m (``vcut``: the fastest V cut whose
ranks hold at most torch 1F1B's bytes saved for backward). The record is a table, one row per m, and the
JSON with every system's figures per m. The longest-sequence half of "the same memory" is not searched
here (its probes do not depend on m but for zbv-mem's cut). Memory has two yardsticks and the verdict
asks both: the peak RSS growth (the measured report's) and what the processes held at once
(``memory.breakdown``: glibc's bytes in use at their peak, one probe step in fresh processes). RSS also
keeps the pages glibc holds after a free, which differ between two schedules that hold the same bytes
(m = 2 on tiny, 2026-12-07: zbv-mem's malloc peak 204.5 MiB, torch 1F1B's 204.5, their RSS growth 367.6
and 347.6).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .paired import paired_ratio
from .report import SAME_MEMORY, loss_check, meta, simulated_ratio
from .scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "measured_microbatch_sweep.md"
OURS = ("zbv", "zbv-mem")
GOAL = 1.1
"""Issue 10's goal: zbv at least 1.1x torch 1F1B's tokens/s at the same memory."""
COUNTS = "2,4,8"
"""``--microbatches`` unless given."""
SYSTEMS = "zbv,zbv-mem,bubbleless-1f1b,1f1b"
"""``--systems`` unless given."""


def parse_counts(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> (2, 4, 8); anything else is a ``ValueError`` that says what to give."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise ValueError(f"--microbatches {text!r}: give distinct positive integers separated by commas, e.g. 2,4,8")
    return counts


def scenarios(scenario: Scenario, counts) -> list[Scenario]:
    """The scenario once per micro-batch count, its zbv-mem cut dropped (``measure_count`` measures one per
    m), everything else kept. A count the scenario refuses (not a divisor of the global batch, not a
    multiple of the workers) is refused here, before anything runs; one whose run fails later (no V cut
    within torch 1F1B's bytes at that m, a rank that dies) is recorded with its error (``main``)."""
    if "1f1b" not in scenario.systems or not set(OURS) & set(scenario.systems):
        raise ValueError(f"the sweep compares {' / '.join(OURS)} with torch's 1f1b; the systems "
                         f"{list(scenario.systems)} lack one of them (use --systems zbv,zbv-mem,1f1b)")
    return [scenario.with_(microbatches=m, zbv_mem_cut=None) for m in counts]


def measure_count(scenario: Scenario, *, progress=None) -> dict:
    """One m: zbv-mem's cut measured for it, then every system's rounds."""
    from .memory import breakdown
    from .runner import measure
    from .vcut import with_measured_cut

    scenario, cut = with_measured_cut(scenario)
    systems = measure(scenario, progress=progress)
    _, equal = loss_check(scenario, systems)
    try:  # the rounds above are the record; a probe that dies costs only the held column
        held = breakdown(scenario, scenario.seq_len, [s for s in (*OURS, "1f1b") if s in scenario.systems])
    except Exception as error:  # noqa: BLE001 - reported in the JSON, the table shows no held ratio
        held = {"error": _error_text(error)}
    return {"microbatches": scenario.microbatches, "micro_batch": scenario.micro_batch,
            "simulated_unit": simulated_ratio(scenario), "cut": cut.as_dict() if cut else None,
            "losses_equal": all(equal.values()) if equal else None, "systems": systems, "memory": held}


def _error_text(error: Exception) -> str:
    """How the record keeps an error that cost a row or a column: its type and the start of its message."""
    return f"{type(error).__name__}: {str(error)[:400]}"


def held_ratio(row: dict, name: str) -> float | None:
    """``name``'s busiest rank's malloc peak over torch 1F1B's (``memory.breakdown``), if measured: None
    where a probe died or glibc's counters are missing (``mallinfo2``: every figure 0)."""
    found = (row.get("memory") or {}).get("systems", {})
    if name not in found or "1f1b" not in found:
        return None
    ours, base = (max(r["malloc_peak_growth"] for r in found[s]["ranks"]) for s in (name, "1f1b"))
    return ours / base if base > 0 else None


def _verdict(row: dict, name: str) -> str:
    """The goal for ``name``: >= ``GOAL``x, RSS and held bytes within ``SAME_MEMORY``, equal losses. Each
    miss is named; a half not measured (held bytes) leaves it 'not judged', never 'met'; and 'met' says
    that the longest-sequence half of the memory goal was not searched (``report.same_memory_verdict``)."""
    systems = row.get("systems") or {}
    ours, base = systems.get(name, {}), systems.get("1f1b", {})
    paired = paired_ratio(systems, name, "1f1b")
    if paired is None or not ours.get("peak_growth_bytes") or not base.get("peak_growth_bytes"):
        return "-"
    rss = ours["peak_growth_bytes"] / base["peak_growth_bytes"]
    held = held_ratio(row, name)
    misses = [f"{paired.median:.3f}x < {GOAL}x"] if paired.median < GOAL else []
    misses += [f"{what} {value:.3f}x > {SAME_MEMORY}x" for what, value in (("RSS", rss), ("held", held))
               if value is not None and value > SAME_MEMORY]
    misses += ["losses differ"] if row.get("losses_equal") is False else []
    if misses:
        met = f"NOT met ({', '.join(misses)})"
    elif held is None:
        met = "not judged (held bytes not measured)"
    else:
        met = "met (longest sequence not searched)"
    return f"{paired.text()}, RSS {rss:.2f}x{'' if held is None else f', held {held:.2f}x'}: {met}"


def _same_schedule(row: dict) -> str:
    paired = paired_ratio(row["systems"], "bubbleless-1f1b", "1f1b")
    return paired.text() if paired is not None else "-"


def _predicted(row: dict) -> str:
    cut = row.get("cut")
    return f"{cut['baseline_ms'] / cut['predicted_ms']:.2f}x on {cut['sizes']}" if cut else "-"


def table(rows: list[dict]) -> list[str]:
    """The summary, one row per m (pure: figures in, Markdown lines out)."""
    lines = ["| m | sequences per micro-batch | simulated zbv / 1F1B (unit costs) | simulated zbv-mem / 1F1B "
             "(profiled costs, its cut) | measured zbv / 1F1B | measured zbv-mem / 1F1B | our 1F1B / torch 1F1B "
             "(the runtimes alone) | losses equal |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:  # the run of this m failed (``main``): its error instead of figures
            lines.append(f"| {row['microbatches']} | - | - | - | failed: {row['error']} | - | - | - |")
            continue
        equal = {True: "yes", False: "NO", None: "-"}[row["losses_equal"]]
        lines.append(f"| {row['microbatches']} | {row['micro_batch']} | {row['simulated_unit']:.2f}x | "
                     f"{_predicted(row)} | {_verdict(row, 'zbv')} | {_verdict(row, 'zbv-mem')} | {_same_schedule(row)} | "
                     f"{equal} |")
    return lines


def write(scenario: Scenario, rows: list[dict], out: Path, command: str, info: dict | None = None) -> tuple[Path, Path]:
    """The record at ``out`` and its JSON beside it; ``info``: a previous run's ``meta`` (``--render``)."""
    info = info or {**meta(scenario), "command": command}
    json_path = out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"meta": info, "rows": rows}, indent=2, sort_keys=True) + "\n")
    lines = [
        f"# Measured: zbv against torch 1F1B as micro-batches vary, scenario {scenario.name} on CPU "
        "(every ratio MEASURED but the simulated columns)", "",
        f"Generated by `{info['command']}`; do not edit by hand. Raw figures: `{json_path.name}`.", "",
        f"Run {info['date']} on {info['machine']}, Python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in sorted(info["versions"].items()))
        + f"; commit {info['commit']} (uncommitted package files at run time: "
        f"{', '.join(info['uncommitted_package_files']) or 'none'}). CPU only, gloo; {scenario.workers} ranks x "
        f"{scenario.threads} torch thread(s); load average when the run ended (1, 5, 15 min): "
        f"{', '.join(map(str, info['load_average']))}.", "",
        f"Global batch {scenario.global_batch} sequences of {scenario.seq_len} tokens for every m; each m is a full "
        f"measured run of {scenario.rounds} rounds x {scenario.steps} timed steps (after {scenario.warmup} warm-up), "
        "every system in fresh processes each round, the order rotated. A measured ratio is the median over "
        "rounds of the paired per-round ratio, min-max in brackets (`bench/measured/paired.py`). RSS: the most "
        "any process grew its peak resident set, over torch 1F1B's; 'the same memory' here is RSS within "
        f"{SAME_MEMORY - 1:.0%}, its longest-sequence half not searched. Held: the busiest rank's most bytes "
        "glibc had handed out at once over torch 1F1B's (`bench/measured/memory.py`, a warm-up step and a step "
        "of min(m, 2 x ranks) micro-batches in fresh processes): what RSS shows less the pages the allocator "
        f"keeps after a free; the verdict asks both within {SAME_MEMORY - 1:.0%}. Goal (issue 10): >= {GOAL}x at the same "
        "memory. zbv runs the even cut; zbv-mem the V cut `vcut` measures for that m.", "",
        *table(rows), "",
        "## Full configuration", "", "```json", json.dumps(_configuration(scenario, rows), indent=1), "```", ""]
    out.write_text("\n".join(lines) + "\n")
    return out, json_path


def _configuration(scenario: Scenario, rows: list[dict]) -> dict:
    """The record's configuration: the scenario as run (its zbv-mem cut measured per m, not the YAML's)."""
    data = scenario.as_dict() | {"microbatches": [r["microbatches"] for r in rows]}
    data.pop("zbv_mem_cut", None)
    return data


def _rendered(path: Path) -> dict:
    """A sweep's JSON as ``write`` wrote it; a ``ValueError`` that says what was given otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--render {path}: cannot read it as JSON ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "scenario" not in data.get("meta", {}):
        raise ValueError(f"--render {path}: not a sweep's JSON (no 'rows' and 'meta.scenario'); give the .json "
                         "that `python -m bench.measured.sweep` wrote beside its markdown")
    return data


def run_counts(runs: list[Scenario], *, progress=None, done=None) -> list[dict]:
    """Every m's row in order. A run that fails costs only its own row (its error recorded); ``done(rows)``
    after each m (``main`` writes the record then, so an interrupted sweep keeps the counts it finished)."""
    rows = []
    for scenario in runs:
        if progress is not None:
            progress.set_postfix_str(f"m={scenario.microbatches}")
        try:
            rows.append(measure_count(scenario, progress=progress))
        except Exception as error:  # noqa: BLE001 - recorded in the row; the other counts still run
            rows.append({"microbatches": scenario.microbatches, "error": _error_text(error)})
        if done is not None:
            done(rows)
    return rows


def main(argv=None) -> int:
    from tqdm import tqdm

    from .scenario import load_scenario

    parser = argparse.ArgumentParser(description="zbv against torch 1F1B over several micro-batch counts.")
    parser.add_argument("--scenario", type=Path, help="a YAML file under bench/scenarios/")
    parser.add_argument("--render", type=Path, default=None,
                        help="re-write the markdown from a sweep's JSON (its meta kept), running nothing")
    parser.add_argument("--microbatches", default=None, help=f"comma-separated micro-batch counts (default {COUNTS})")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated; must hold 1f1b and zbv or zbv-mem (default {SYSTEMS})")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per m (default: the scenario's)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="markdown path, JSON beside it (default: the tracked record, which --render rewrites)")
    args = parser.parse_args(argv)
    if args.render:
        from .scenario import scenario_from_dict

        given = [flag for flag, value in (("--scenario", args.scenario), ("--microbatches", args.microbatches),
                                          ("--systems", args.systems), ("--rounds", args.rounds)) if value is not None]
        if given:
            parser.error(f"--render runs nothing, so {', '.join(given)} would be ignored: drop them")
        try:
            data = _rendered(args.render)
        except ValueError as error:
            parser.error(str(error))
        base = scenario_from_dict(data["meta"]["scenario"])
        md, _ = write(base, data["rows"], args.out, data["meta"]["command"], info=data["meta"])
        print(md.read_text())
        return 0
    if args.scenario is None:
        parser.error("give --scenario bench/scenarios/NAME.yaml (or --render SWEEP.json)")
    try:
        base = load_scenario(args.scenario).with_(systems=tuple((args.systems or SYSTEMS).split(",")))
        if args.rounds is not None:
            base = base.with_(rounds=args.rounds)
        runs = scenarios(base, parse_counts(args.microbatches or COUNTS))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = ("python -m bench.measured.sweep " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    with tqdm(total=sum(s.rounds * len(s.systems) for s in runs), unit="run", file=sys.stderr) as bar:
        rows = run_counts(runs, progress=bar, done=lambda rows: write(base, rows, args.out, command))
    print(args.out.read_text())
    failed = [row["microbatches"] for row in rows if "error" in row]
    if failed:
        print(f"error: the runs at m={', '.join(map(str, failed))} failed (their errors are in the table)",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
