"""python -m bench.measured --scenario bench/scenarios/tiny.yaml [--quick] [--systems zbv,1f1b] [--no-longest]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "measured.md"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run every system of a scenario for real (CPU, gloo).")
    parser.add_argument("--scenario", type=Path, help="a YAML file under bench/scenarios/")
    parser.add_argument("--render", type=Path, default=None,
                        help="re-write the markdown from a run's JSON (its meta kept), running nothing")
    parser.add_argument("--systems", default=None, help="comma-separated subset of the scenario's systems")
    parser.add_argument("--quick", action="store_true",
                        help="one round of 3 timed steps after 1 warm-up, no longest-sequence search")
    parser.add_argument("--no-longest", action="store_true", help="skip the longest-sequence search")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default: the scenario's)")
    parser.add_argument("--no-calibration", action="store_true", help="skip the modelled-vs-measured table")
    parser.add_argument("--memory-seq", type=int, default=4096,
                        help="sequence of the per-rank memory section (bench/measured/memory.py); 0: skip it")
    parser.add_argument("--measure-small-ops", action="store_true",
                        help="time the cpu profile's small-op rates right before the first round and after the "
                             "last (bench/measured/inrun_ops.py) and price the calibration on them")
    parser.add_argument("--out", type=Path, default=RESULTS, help="markdown path (JSON beside it)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from tqdm import tqdm

    from .report import failures, ran, write
    from .runner import longest_sequence, measure
    from .scenario import load_scenario

    args = parse_args(argv)
    if args.render:
        from .report import rerender

        md, _ = rerender(args.render, args.out, calibration=not args.no_calibration)
        print(f"wrote {md}")
        return 0
    if args.scenario is None:
        print("error: give --scenario bench/scenarios/NAME.yaml (or --render RUN.json)", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario)
        if args.systems:
            scenario = scenario.with_(systems=tuple(args.systems.split(",")))
        if args.quick:
            scenario = scenario.with_(rounds=1, steps=3, warmup=1)
        if args.rounds is not None:
            scenario = scenario.with_(rounds=args.rounds)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from .vcut import with_measured_cut

    scenario, cut = with_measured_cut(scenario)  # zbv-mem's cut, once, for every round, probe and the record
    from . import inrun_ops

    small_ops = {"before": inrun_ops.measure(scenario)} if args.measure_small_ops else None
    with tqdm(total=scenario.rounds * len(scenario.systems), unit="run", file=sys.stderr) as bar:
        systems = measure(scenario, progress=bar)
    if small_ops is not None:
        small_ops["after"] = inrun_ops.measure(scenario)
    if cut is not None:
        systems["zbv-mem"]["cut"] = cut.as_dict()
    longest = {}
    if not (args.quick or args.no_longest):
        with tqdm(unit="probe", file=sys.stderr) as bar:
            for name in scenario.systems:
                if ran(systems[name]):
                    longest[name] = longest_sequence(scenario, name, progress=bar)
    memory = None
    pipelines = [s for s in ("zbv", "zbv-mem", "bubbleless-1f1b", "1f1b") if s in scenario.systems]
    if pipelines and args.memory_seq and not args.quick:
        from .memory import breakdown

        memory = breakdown(scenario, args.memory_seq, pipelines)
    calibration = None
    if not args.no_calibration:
        from .calibration import calibration_section

        calibration = calibration_section(scenario, systems, small_ops=small_ops)
    command = "python -m bench.measured " + " ".join(argv if argv is not None else sys.argv[1:])
    md, js = write(scenario, systems, longest, args.out, calibration=calibration, command=command.strip(),
                   memory=memory, small_ops=small_ops)
    print(f"wrote {md} and {js}")
    print(md.read_text())
    return 1 if failures(systems) else 0


if __name__ == "__main__":
    raise SystemExit(main())
