"""``bubbleless-schedules``: show one schedule, compare them all, list what is registered.

    bubbleless-schedules show zbv -p 4 -m 8 --costs 18.5,18.1,9.3,0.6 --png zbv.png --trace zbv.json
    bubbleless-schedules compare -p 8 -m 24 --memory-limit 8
    bubbleless-schedules list
    bubbleless-schedules --import my_schedules compare -p 4 -m 8   # with the schedules my_schedules registers

``--import MODULE`` (repeatable) imports a module first, so the schedules its ``@register`` decorators add
are shown, compared and listed with the built-ins (the module must be importable: on ``sys.path``, which
includes the current directory). Bad input (an unknown name, a shape a schedule cannot run, malformed costs) exits with status 2 and
the ValueError's text, the way argparse reports its own errors. ``show`` and ``compare`` draw shapes up to
``MAX_RANKS`` ranks and ``MAX_RANK_MICROBATCHES`` ranks x micro-batches (a few seconds to generate and a
grid a terminal can show); a larger shape is refused saying so: call ``generate`` from Python for it.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from collections.abc import Sequence

from .costs import Costs
from .registry import aliases, available, generate
from .simulate import Timeline, simulate
from .timeline_text import render_timeline

PROG = "bubbleless-schedules"
MAX_RANKS = 256
MAX_RANK_MICROBATCHES = 32_768
"""The largest shape ``show`` and ``compare`` take: zb at p=64 m=512 (32,768) generates in about 3 s here."""


def _check_size(args: argparse.Namespace) -> None:
    size = args.ranks * args.microbatches
    if args.ranks > MAX_RANKS or size > MAX_RANK_MICROBATCHES:
        raise ValueError(
            f"-p {args.ranks} -m {args.microbatches} is larger than this command draws (at most {MAX_RANKS} ranks "
            f"and {MAX_RANK_MICROBATCHES:,} ranks x micro-batches, here {size:,}); use fewer, or call "
            f"bubbleless_schedules.generate from Python for a shape this large"
        )


def _costs(text: str) -> Costs:
    try:
        return Costs.parse(text)
    except ValueError as exc:  # argparse would otherwise replace the message with "invalid value"
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _shape_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--ranks", type=_positive_int, required=True, help="number of pipeline ranks")
    parser.add_argument("-m", "--microbatches", type=_positive_int, required=True, help="micro-batches per step")
    parser.add_argument("--costs", type=_costs, default=None, metavar="F,I,W[,C]",
                        help="per-rank costs of forward, input-grad, weight-grad (and comm); default unit costs")
    parser.add_argument("--memory-limit", type=float, default=None, metavar="M_B",
                        help="activation memory limit per rank, in M_B (one micro-batch on one rank's share; inf: none)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Pipeline schedules as data: show, compare, list.")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, so the schedules it registers join the built-ins (repeatable)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{show,compare,list}")

    show = commands.add_parser("show", help="draw one schedule: grid, text timeline, summary, files")
    show.add_argument("name", help="a registered schedule name or alias (see `list`)")
    _shape_arguments(show)
    show.add_argument("--png", metavar="PATH", help="write a Gantt chart (needs the [plot] extra)")
    show.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace JSON")
    show.add_argument("--csv", metavar="PATH", help="write the schedule as CSV (loads back with Schedule.from_csv)")
    show.add_argument("--width", type=int, default=None, help="columns of the text timeline (default: terminal)")

    compare = commands.add_parser("compare", help="table of every registered schedule, best first")
    _shape_arguments(compare)

    commands.add_parser("list", help="registered schedule names and their aliases")
    return parser


def _summary_line(timeline: Timeline) -> str:
    return (
        f"makespan {timeline.makespan:.6g}   bubble {timeline.bubble_rate:.4f} of the makespan, "
        f"{timeline.span_bubble_rate:.4f} within the worst rank's own span   "
        f"peak memory {timeline.max_peak_memory:.4g} M_B (per rank: "
        + ", ".join(f"{m:g}" for m in timeline.peak_memory) + ")"
    )


def run_show(args: argparse.Namespace) -> None:
    _check_size(args)
    schedule = generate(args.name, num_ranks=args.ranks, num_microbatches=args.microbatches,
                        costs=args.costs, memory_limit=args.memory_limit)
    timeline = simulate(schedule, args.costs)
    width = args.width or max(40, shutil.get_terminal_size((120, 24)).columns - 10)
    print(schedule.header())
    print(schedule.render())
    print()
    print(render_timeline(timeline, width))
    print()
    print(_summary_line(timeline))
    if args.csv:
        schedule.to_csv(args.csv)
        print(f"wrote {args.csv}")
    if args.trace:
        from .trace import write_trace

        write_trace(timeline, args.trace)
        print(f"wrote {args.trace}")
    if args.png:
        from .plot import plot_timeline

        plot_timeline(timeline, args.png)
        print(f"wrote {args.png}")


def compare_rows(num_ranks: int, num_microbatches: int, costs: Costs | None, memory_limit: float | None):
    """([(registered name, timeline)] best first, [(name, reason)] for schedules that cannot run this
    shape or limit, or that fail with another exception than ValueError). The registered name can differ from
    the schedule's own (``auto`` returns the schedule it picked)."""
    ran, refused = [], []
    for name in available():
        try:
            schedule = generate(name, num_ranks=num_ranks, num_microbatches=num_microbatches,
                                costs=costs, memory_limit=memory_limit)
            ran.append((name, simulate(schedule, costs)))
        except ValueError as exc:
            refused.append((name, _first_line(exc)))
        except Exception as exc:  # a generator's bug: listed with the rest, so the others still compare
            refused.append((name, f"generator {name!r} failed: {type(exc).__name__}: {_first_line(exc)}"))
    ran.sort(key=lambda row: (row[1].makespan, row[1].max_peak_memory, row[0]))
    return ran, refused


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [""])[0]


def run_compare(args: argparse.Namespace) -> None:
    _check_size(args)
    ran, refused = compare_rows(args.ranks, args.microbatches, args.costs, args.memory_limit)
    limit = "none" if args.memory_limit is None else f"{args.memory_limit:g} M_B"
    costs = args.costs or Costs.unit()
    print(f"p={args.ranks} m={args.microbatches} costs F={costs.forward} I={costs.backward_input} "
          f"W={costs.backward_weight} C={costs.comm} memory limit {limit}")
    head = f"{'#':>2}  {'schedule':<24} {'makespan':>10} {'bubble':>8} {'in-span':>8} {'peak M_B':>9} {'vs best':>8}"
    print(head)
    print("-" * len(head))
    best = ran[0][1].makespan if ran else 0.0
    for i, (name, t) in enumerate(ran, 1):
        label = name if t.schedule.name in ("", name) else f"{name} -> {t.schedule.name}"
        ratio = t.makespan / best if best > 0 else 1.0
        print(f"{i:>2}  {label:<24} {t.makespan:>10.5g} {t.bubble_rate:>8.4f} "
              f"{t.span_bubble_rate:>8.4f} {t.max_peak_memory:>9.4g} {ratio:>7.3f}x")
    for name, reason in refused:
        print(f" -  {name:<24} cannot run: {reason}")


def run_list(args: argparse.Namespace) -> None:
    alias_of: dict[str, list[str]] = {}
    for alias, name in aliases().items():
        alias_of.setdefault(name, []).append(alias)
    for name in available():
        extra = f"  (alias: {', '.join(alias_of[name])})" if name in alias_of else ""
        print(f"{name}{extra}")


def _import_plugins(modules: Sequence[str]) -> None:
    """Import each module of ``--import``: its ``@register`` decorators add its schedules."""
    if modules and "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` would have it
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"--import {module}: cannot import it ({exc}); give a module on sys.path (the "
                             "current directory counts), e.g. my_schedules for ./my_schedules.py") from exc


COMMANDS = {"show": run_show, "compare": run_compare, "list": run_list}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``bubbleless-schedules``; returns 0, exits with status 2 on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _import_plugins(args.imports)
        COMMANDS[args.command](args)
    except ValueError as exc:
        parser.exit(2, f"{PROG} {args.command}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
