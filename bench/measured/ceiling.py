"""How much faster than 1F1B can zbv be on a scenario, at 1F1B's memory? The simulator's answer on
per-layer costs measured here, with the backward split as it costs and as if it were free.

    python -m bench.measured.ceiling --scenario bench/scenarios/tiny.yaml [--repeats 60]

- Costs: every layer's forward and full backward, and its forward under ``defer_weight_grads`` with
  the I and W that follow, timed on one micro-batch in this process (the scenario's torch threads);
  each the minimum over ``repeats``, the cost with the least interference from other processes on a
  shared machine (medians there measure the load).
- Memory: the bytes each layer's forward saves for backward (``bubbleless_partition.profile``'s count);
  a V cut is "at 1F1B's memory" when no rank's peak exceeds torch 1F1B's busiest on its even cut, the
  rule ``vcut`` uses for zbv-mem.
- Predictions: 1F1B on the even cut (its B split evenly into I and W: the simulator needs both, only the
  sum matters to 1F1B) against zbv on every V cut: the unit-cost ZB-V order (what ``zbv`` runs) and
  the order the ``zbv`` generator searches for these stage costs; the split as measured, and free
  (I + W = B, the plain forward).

It prints the ceiling; it records nothing (the measured record, ``bench/results/measured_pipelines.md``,
is the verdict; this says what the verdict can be at most).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def layer_costs(scenario, repeats: int) -> list[dict[str, float]]:
    """Per layer: min seconds of F, B (plain), and Fd, I, W (deferred forward, input and weight grads)."""
    from bubbleless_runtime import defer_weight_grads, run_weight_grads

    from .tiny import TokenLoss, batch, make_layers

    layers = make_layers(scenario)
    x, y = batch(scenario, 0)
    x, y = x[:scenario.micro_batch].clone(), y[:scenario.micro_batch].clone()
    loss = TokenLoss(scenario.tokens_per_step)
    inputs = [x]
    with torch.no_grad():
        for layer in layers[:-1]:
            inputs.append(layer(inputs[-1]))
    rows = []
    for i, layer in enumerate(layers):
        best = dict.fromkeys(("F", "B", "Fd", "I", "W"), float("inf"))
        last = i == len(layers) - 1
        for _ in range(repeats):
            for split in (False, True):
                layer.zero_grad(set_to_none=True)
                a = inputs[i].detach().requires_grad_(inputs[i].is_floating_point())
                queue: list = []
                t0 = time.perf_counter()
                with defer_weight_grads(queue) if split else torch.enable_grad():
                    out = layer(a)
                t1 = time.perf_counter()
                root, grad = (loss(out, y), None) if last else (out, torch.ones_like(out))
                root.backward(grad)
                t2 = time.perf_counter()
                run_weight_grads(queue)
                t3 = time.perf_counter()
                spans = {"Fd": t1 - t0, "I": t2 - t1, "W": t3 - t2} if split else {"F": t1 - t0, "B": t2 - t1}
                for key, seconds in spans.items():
                    best[key] = min(best[key], seconds)
        rows.append(best)
    return rows


def layer_bytes(scenario) -> list[int]:
    from bubbleless_partition import profile

    from .tiny import batch, make_layers

    x, _ = batch(scenario, 0)
    costs = profile(make_layers(scenario), x[:scenario.micro_batch].clone(), repeats=1, warmup=0, name="bytes")
    return [round(c.activation_bytes_per_token * costs.tokens_per_microbatch) for c in costs.layers]


def stage_costs(rows, sizes, *, split: bool):
    """Simulator ``Costs`` (ms) of a cut: the split as measured (``split``) or free (plain F, I + W = B)."""
    from bubbleless_schedules import Costs

    from .vcut import _per_stage

    def per_stage(key):
        return tuple(v * 1e3 for v in _per_stage([r[key] for r in rows], sizes))

    if split:
        return Costs(per_stage("Fd"), per_stage("I"), per_stage("W"), 0.0)
    half = tuple(b / 2 for b in per_stage("B"))
    return Costs(per_stage("F"), half, half, 0.0)


def main(argv=None) -> int:
    from bubbleless_schedules import generate, simulate

    from .scenario import load_scenario
    from .vcut import _per_stage, compositions, rank_peaks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args(argv)
    scenario = load_scenario(args.scenario)
    torch.set_num_threads(scenario.threads)
    rows = layer_costs(scenario, args.repeats)
    nbytes = layer_bytes(scenario)
    print("per layer, ms (min of", args.repeats, "): F B | F deferred I W")
    for i, r in enumerate(rows):
        print(f"  {i}: {r['F'] * 1e3:.2f} {r['B'] * 1e3:.2f} | {r['Fd'] * 1e3:.2f} {r['I'] * 1e3:.2f} {r['W'] * 1e3:.2f}")
    p, m, n = scenario.workers, scenario.microbatches, len(rows)
    even = [n // p] * p
    one_f_one_b = generate("1f1b", num_ranks=p, num_microbatches=m)
    base = simulate(one_f_one_b, stage_costs(rows, even, split=False)).makespan
    limit = max(rank_peaks(one_f_one_b, _per_stage(nbytes, even)))
    unit_zbv = generate("zbv", num_ranks=p, num_microbatches=m)
    print(f"torch 1F1B, even cut: {base:.1f} ms simulated; busiest rank saves {limit / 2**20:.1f} MiB")
    print("V cut | rank peaks MiB (zbv order; searched order) | at 1F1B's memory | zbv order: split as measured, "
          "free | searched order: split as measured, free")
    for sizes in compositions(n, 2 * p):
        peaks = rank_peaks(unit_zbv, _per_stage(nbytes, sizes))
        unit, searched, searched_peaks = [], [], peaks
        for split in (True, False):
            costs = stage_costs(rows, sizes, split=split)
            order = generate("zbv", num_ranks=p, num_microbatches=m, costs=costs)
            unit.append(base / simulate(unit_zbv, costs).makespan)
            searched.append(base / simulate(order, costs).makespan)
            searched_peaks = max(searched_peaks, rank_peaks(order, _per_stage(nbytes, sizes)), key=max)
        fits = "yes" if max(peaks) <= limit else "no"
        if max(searched_peaks) > limit >= max(peaks):
            fits += " (the searched order: no)"
        print(f"  {list(sizes)} | {', '.join(f'{v / 2**20:.1f}' for v in peaks)}; "
              f"{', '.join(f'{v / 2**20:.1f}' for v in searched_peaks)} | {fits} | {unit[0]:.3f}x, {unit[1]:.3f}x | "
              f"{searched[0]:.3f}x, {searched[1]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
