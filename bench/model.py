"""Modelled tokens/s, step time and longest sequence of one training system at one point (issue 10, 3).

    python bench/model.py --hardware rtx4090 --gpus 8 --model qwen3-1.7b --system zero-infinity \\
        --seq-len 2048 --json
    python bench/model.py --table              # writes bench/results/modelled.md (+ PNG plots)
    python bench/model.py --measure-cpu        # writes bench/modelled/cpu.yaml (the calibration profile)
    python bench/model.py --list               # systems, models, hardware

Every number printed is modelled (``"modelled": true``); see bench/modelled/ for each model's assumptions.
``max_seq_len`` is the longest sequence the plan chosen at ``--seq-len`` trains (a stage-bound system's cut,
the round-robin pool's one-layer groups). Another ``--seq-len`` may choose another cut with another longest
sequence, so a length below one point's ``max_seq_len`` may not fit when asked for itself: the cut is chosen
for speed alone, as the runtime's ``partition="auto"`` does without a memory cap.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `bench` importable
    sys.path.insert(0, str(ROOT))

from bench.modelled import Point, predict, systems  # noqa: E402
from bench.modelled.common import PRECISIONS  # noqa: E402
from bench.modelled.cpu_ops import load_cpu_profile  # noqa: E402
from bench.strict_json import dumps  # noqa: E402
from bubbleless_partition import HARDWARE, SHAPES, hardware, shape  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "modelled.md"
DEFAULT_LORA = {"qwen3-235b-a22b": 16}
"""The issue's 235B scenario is LoRA: rank 16 unless --lora-rank says otherwise (0: full fine-tuning)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="rtx4090",
                        help=f"a built-in profile ({', '.join(sorted(HARDWARE))}) or a YAML file")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--model", default="qwen3-1.7b", choices=sorted(SHAPES))
    parser.add_argument("--system", default="roundrobin")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument("--global-batch", type=int, default=32, help="sequences per optimizer step")
    parser.add_argument("--precision", default="bf16", choices=sorted(PRECISIONS))
    parser.add_argument("--lora-rank", type=int, default=None,
                        help="LoRA rank (default: 16 for qwen3-235b-a22b, else full fine-tuning; 0 forces full)")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument("--table", action="store_true", help=f"write {RESULTS.relative_to(ROOT)} and plots")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where --table writes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes --table plans the round-robin points in (default: one per CPU)")
    parser.add_argument("--measure-cpu", action="store_true", help="measure this CPU, write the cpu profile")
    parser.add_argument("--cpu-profile", type=Path, default=None, help="where --measure-cpu writes")
    parser.add_argument("--list", action="store_true", help="list systems, models and hardware")
    return parser.parse_args(argv)


def point_of(args: argparse.Namespace) -> Point:
    path = Path(args.hardware)
    # a YAML profile with its measured small-op rates when they lie beside it (cpu.yaml + cpu_ops.yaml),
    # priced as the calibration and the report price it (``profile_of``); a GPU profile file loads as it is
    yaml = path.suffix in (".yaml", ".yml")
    if yaml and not path.is_file():
        raise ValueError(f"--hardware {args.hardware}: no such profile file (built-in: {', '.join(sorted(HARDWARE))})")
    hw = load_cpu_profile(path) if yaml else hardware(args.hardware)
    lora = DEFAULT_LORA.get(args.model) if args.lora_rank is None else (args.lora_rank or None)
    return Point(shape=shape(args.model), hardware=hw, gpus=args.gpus, seq_len=args.seq_len,
                 micro_batch=args.micro_batch, global_batch=args.global_batch, precision=args.precision,
                 lora_rank=lora)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, system in systems().items():
            print(f"{name:18} {'baseline' if system.baseline else 'ours    '}  {system.description}")
        print("models:", ", ".join(SHAPES), "| hardware:", ", ".join(HARDWARE))
        return 0
    if args.measure_cpu:
        from bench.modelled.cpu_profile import DEFAULT_PATH, write_cpu_profile

        path = args.cpu_profile or DEFAULT_PATH
        hw = write_cpu_profile(path)
        print(f"wrote {path}: {hw.description}")
        return 0
    if args.table:
        from bench.modelled.report import write_report

        if args.jobs < 1:
            print(f"error: --jobs {args.jobs}: give 1 or more processes", file=sys.stderr)
            return 2
        print(f"wrote {write_report(args.out, jobs=args.jobs)}")
        return 0
    try:
        point = point_of(args)
        result = predict(args.system, point)
    except (ValueError, OSError) as error:  # OSError: a profile file that exists but cannot be read
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = result.as_dict()
        out.update(hardware=point.hardware.name, gpus=point.gpus, model=args.model, seq_len=point.seq_len,
                   micro_batch=point.micro_batch, global_batch=point.global_batch, precision=point.precision,
                   lora_rank=point.lora_rank)
        print(dumps(out, sort_keys=False))  # a point that does not fit: step and peak null, not Infinity
        return 0
    fits = (f"{result.tokens_per_s:,.0f} tokens/s, step {result.step_s:.2f} s" if result.fits else "does not fit")
    peak = (f"peak {result.peak_device_bytes / 2**30:.1f} GiB per device" if math.isfinite(result.peak_device_bytes)
            else "no peak (no plan)")
    print(f"modelled: {args.system} on {point.gpus}x {point.hardware.name}, {point.shape.name}"
          f"{' LoRA r' + str(point.lora_rank) if point.lora_rank else ''}, seq {point.seq_len}: {fits}; "
          f"{peak}; longest sequence {result.max_seq_len:,}")
    for note in result.notes:
        print(f"  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
