"""CPU Adam throughput on this machine: torch AdamW (foreach, its CPU default), torch AdamW(fused=True)
(torch's fused CPU kernel, torch >= 2.4) and DeepSpeed's ``DeepSpeedCPUAdam`` (if it builds here).

    python bench/offload/cpu_adam.py [--params 16000000] [--rounds 5] [--out bench/results/cpu_adam.md]

One run, the optimizers alternating round by round so drift on a shared machine hits each alike; each
round times one ``step()`` per optimizer over the same fp32 parameter sizes (a transformer-like mix of
matrices and vectors), and the table gives the median params/s. Equality: every optimizer starts from
the same parameters, sees the same gradients for three steps, and the largest difference from the
foreach result is reported (fp32 rounding is ~1e-7 relative).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

SETTINGS = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def shapes(total: int) -> list[tuple[int, ...]]:
    """Matrices of 1024 x 1024-ish and a few vectors, adding up to about ``total`` elements."""
    out, n = [], 0
    while n < total:
        out += [(1024, 1024), (1024,), (1024,)]
        n += 1024 * 1024 + 2048
    return out


def make(kind: str, params: list[torch.Tensor]):
    if kind == "torch-foreach":
        return torch.optim.AdamW(params, foreach=True, **SETTINGS)
    if kind == "torch-fused":
        return torch.optim.AdamW(params, fused=True, **SETTINGS)
    if kind == "torch-for-loop":
        return torch.optim.AdamW(params, foreach=False, **SETTINGS)
    if kind == "deepspeed-cpu-adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, adamw_mode=True, **SETTINGS)
    raise ValueError(kind)


def fresh(sizes, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).requires_grad_(True) for s in sizes]


def set_grads(params, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2


def try_deepspeed() -> str | None:
    """None if DeepSpeedCPUAdam builds and runs here, else why not."""
    try:
        t0 = time.perf_counter()
        probe = [torch.zeros(4, requires_grad=True)]
        opt = make("deepspeed-cpu-adam", probe)
        probe[0].grad = torch.ones(4)
        opt.step()
        print(f"DeepSpeedCPUAdam built and ran in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return None
    except Exception as error:  # noqa: BLE001 - reported in the table
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=16_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    kinds = ["torch-foreach", "torch-fused", "torch-for-loop"]
    ds_error = try_deepspeed()
    if ds_error is None:
        kinds.append("deepspeed-cpu-adam")
    sizes = shapes(args.params)
    numel = sum(torch.Size(s).numel() for s in sizes)
    # equality: three identical steps each
    results = {}
    for kind in kinds:
        params = fresh(sizes, 0)
        opt = make(kind, params)
        for step in range(3):
            set_grads(params, 100 + step)
            opt.step()
        results[kind] = [p.detach().clone() for p in params]
        del opt, params
    base = results["torch-foreach"]
    diffs = {}
    for kind, got in results.items():
        abs_diff = max(float((a - b).abs().max()) for a, b in zip(got, base, strict=True))
        rel = max(float(((a - b).abs() / b.abs().clamp_min(1e-6)).max()) for a, b in zip(got, base, strict=True))
        diffs[kind] = (abs_diff, rel, all(torch.equal(a, b) for a, b in zip(got, base, strict=True)))
    del results, base
    # timing: alternate
    opts = {}
    for kind in kinds:
        params = fresh(sizes, 1)
        set_grads(params, 7)
        opts[kind] = make(kind, params)
        opts[kind].step()  # warm-up (and state allocation)
    times = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            t0 = time.perf_counter()
            opts[kind].step()
            times[kind].append(time.perf_counter() - t0)
    rows = []
    for kind in kinds:
        med = statistics.median(times[kind])
        rows.append((kind, numel / med, med, min(times[kind]), max(times[kind])))
    foreach_rate = rows[0][1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    lines = [
        "# CPU Adam throughput (MEASURED on this machine)",
        "",
        f"Generated by `python bench/offload/cpu_adam.py --params {args.params} --rounds {args.rounds}`; "
        "do not edit by hand.",
        "",
        f"Run {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} on "
        f"{platform.platform()}, {os.cpu_count()} CPUs (shared with other jobs), torch threads "
        f"{torch.get_num_threads()}, Python {platform.python_version()}, torch {torch.__version__}; commit {commit}. "
        f"{numel:,} fp32 parameters in {len(sizes)} tensors (1024x1024 matrices and 1024 vectors), AdamW "
        f"lr={SETTINGS['lr']}, betas={SETTINGS['betas']}, eps={SETTINGS['eps']}, weight_decay={SETTINGS['weight_decay']}; "
        f"{args.rounds} rounds, the optimizers alternating; one step() timed per round.",
        "",
        "| optimizer | params/s (median) | x torch foreach | step s (median, min, max) | "
        "3 steps vs foreach: max abs diff, max rel diff | bit-identical |",
        "|---|---|---|---|---|---|",
    ]
    for kind, rate, med, lo, hi in rows:
        abs_diff, rel, same = diffs[kind]
        lines.append(f"| {kind} | {rate:.3g} | {rate / foreach_rate:.2f}x | {med:.3f} ({lo:.3f}, {hi:.3f}) | "
                     f"{abs_diff:.2e}, {rel:.2e} | {'yes' if same else 'no'} |")
    if ds_error is not None:
        lines += ["", f"DeepSpeedCPUAdam: not measured ({ds_error})."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
