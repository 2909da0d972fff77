"""The measured half of the regression check: tokens/s from ``bench.measured`` runs against
bench/baselines/measured.json, with a noise-aware threshold written down per figure.

Threshold, per system: ``max(MIN_DROP, SPREADS * spread)`` where ``spread`` is the larger of (a) the
median absolute deviation of the per-step tokens/s over the median, pooled over the runs given, and
(b) half the range of the runs' medians over their median (run-to-run noise; 0 with one run). A fresh
median below ``value * (1 - threshold)`` fails. Measured figures only compare on the machine they were
measured on (the result's ``machine`` string): elsewhere the check says so and skips them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

MIN_DROP = 0.10
"""The smallest drop a measured figure may fail on: below this a shared 2-core machine's load moves it."""
SPREADS = 3.0
"""How many spreads of noise a drop must exceed."""


def _load(path: Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no measured result {path}; run `python -m bench.measured --scenario ...` first")
    data = json.loads(path.read_text())
    if "systems" not in data or "meta" not in data:
        raise ValueError(f"{path} is not a bench.measured result (no 'systems' / 'meta')")
    return data


def _figures(run: dict) -> dict[str, tuple[float, list[float]]]:
    """``scenario/system/tokens_per_s`` -> (median, per-step samples) of one run."""
    scenario = run["meta"]["scenario"]["name"]
    return {f"{scenario}/{name}/tokens_per_s": (row["tokens_per_s"], row.get("samples_tokens_per_s", []))
            for name, row in run["systems"].items() if row.get("tokens_per_s")}


def noise_threshold(medians: list[float], samples: list[float]) -> tuple[float, float]:
    """(threshold, spread) from the runs' medians and their pooled per-step samples."""
    centre = statistics.median(medians)
    spread = 0.0
    if samples:
        mid = statistics.median(samples)
        spread = statistics.median(abs(s - mid) for s in samples) / mid
    if len(medians) > 1:
        spread = max(spread, (max(medians) - min(medians)) / 2 / centre)
    return max(MIN_DROP, SPREADS * spread), spread


def update_measured(paths: list[Path], folder: Path) -> Path:
    from bench.check import write_json

    runs = [_load(p) for p in paths]
    machines = {r["meta"]["machine"] for r in runs}
    if len(machines) != 1:
        raise ValueError(f"the runs come from different machines ({sorted(machines)}): give runs of one machine")
    per_key: dict[str, tuple[list[float], list[float]]] = {}
    for run in runs:
        for key, (median, samples) in _figures(run).items():
            medians, pooled = per_key.setdefault(key, ([], []))
            medians.append(median)
            pooled.extend(samples)
    figures = {}
    for key, (medians, pooled) in per_key.items():
        threshold, spread = noise_threshold(medians, pooled)
        figures[key] = {"value": round(statistics.median(medians), 3), "threshold": round(threshold, 4),
                        "spread": round(spread, 4), "runs": len(medians), "steps": len(pooled)}
    path = Path(folder) / "measured.json"
    write_json(path, {
        "about": "Measured tokens/s (median of timed steps) per scenario and system; a drop beyond 'threshold' "
                 f"(relative) fails. threshold = max({MIN_DROP}, {SPREADS} x spread), spread from the runs' "
                 "per-step MAD and run-to-run range (bench/measured_baseline.py). Only valid on 'machine'.",
        "machine": machines.pop(), "figures": figures,
        "from": [r["meta"].get("date", "?") + " " + r["meta"].get("commit", "?") for r in runs],
    })
    return path


def check_measured(paths: list[Path], folder: Path):
    """(findings, notes) for the measured figures of the runs at ``paths`` (the last run wins per key)."""
    from bench.check import compare

    path = Path(folder) / "measured.json"
    if not path.exists():
        return [], [f"no measured baseline at {path}; write one with `python -m bench.check --update --measured RUN.json`"]
    baseline = json.loads(path.read_text())
    findings, notes = [], []
    for run in (_load(p) for p in paths):
        if run["meta"]["machine"] != baseline["machine"]:
            notes.append(f"skipped: measured on {run['meta']['machine']!r}, the baseline on {baseline['machine']!r}")
            continue
        fresh = {k: median for k, (median, _) in _figures(run).items()}
        old = {k: v["value"] for k, v in baseline["figures"].items() if k.split("/")[0] == run["meta"]["scenario"]["name"]}
        thresholds = {k: v["threshold"] for k, v in baseline["figures"].items()}
        # a run may hold fewer systems than the baseline (a quick run): those are noted, not failed
        findings += [f for f in compare(old, fresh, "higher", prefix="measured/", thresholds=thresholds)
                     if f.kind != "missing"]
        missing = sorted(set(old) - set(fresh))
        if missing:
            notes.append(f"not in this run (not checked): {', '.join(missing)}")
    return findings, notes
