"""The deterministic figures CI tracks (issue 10, section 4): pure functions of the code, no timing.

- ``modelled``: modelled tokens/s and longest sequence of every system at a fixed set of points
  (bench/modelled/, the same ``predict`` the report uses);
- ``schedules``: simulated makespans of every registered schedule on a small grid of shapes, under
  unit costs and under one uneven set (I dearer than F, W cheaper, a transfer latency);
- ``ratios``: per schedule and shape, 1F1B's makespan over its own (the speedup) and its bubble rate.

Each figure has a direction (higher or lower is better), so a check can tell a drop from a gain.
Names are ``group/key``: ``modelled/tokens_per_s/zbv qwen3-1.7b rtx4090 x8``.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass

HIGHER, LOWER = "higher", "lower"


@dataclass(frozen=True, kw_only=True)
class FigureSet:
    """One baseline file's worth of figures."""

    name: str
    """File stem under bench/baselines/ (``modelled`` -> modelled.json)."""
    about: str
    """One line a reviewer reads at the top of the file: what the figures are, how they were made."""
    groups: dict[str, str]
    """Group name -> direction (``higher`` or ``lower`` is better)."""
    compute: object
    """Function ``(keys: set | None) -> {group: {key: value}}``; ``keys`` limits it to those keys."""


MODELLED_SYSTEMS = ("roundrobin", "roundrobin-sync", "zb", "zbv", "bubbleless-1f1b", "zero-infinity", "zero2",
                    "fsdp-offload", "1f1b")
"""``roundrobin-sync`` too: the README's headline quotes its synchronous column beside the asynchronous one."""
MODELLED_POINTS = (  # (model, hardware, gpus): seq 2048, 32 sequences per step, bf16 (the report's setting)
    ("qwen3-1.7b", "rtx4090", 8), ("qwen3-1.7b", "a800", 8), ("llama-3.1-8b", "rtx4090", 8),
    ("llama-3.1-8b", "a800", 8), ("qwen3-32b", "rtx4090", 8),
)
"""Five points: the two round-robin systems plan for 25-90 s a point on the build VM (the bulk of the check's
5-9 minutes), every other system in about 2 s."""
STAGE_BOUND_SYSTEMS = ("zbv", "1f1b")
STAGE_BOUND_POINTS = tuple((model, hw, 8) for hw in ("mi300x", "h200")
                           for model in ("qwen3-1.7b", "llama-3.1-8b", "qwen3-32b", "qwen3-235b-a22b"))
"""The README's datacenter claim (zbv over torch 1F1B on 8 A800 / MI300X / H200, 1.7B to the 235B LoRA; the
A800 half is in MODELLED_POINTS): stage-bound systems only, each point plans in about 2 s (no round-robin)."""
SCHEDULE_SHAPES = ((2, 4), (4, 8), (4, 12), (8, 16))
UNEVEN = {"forward": 1.0, "backward_input": 1.2, "backward_weight": 0.8, "comm": 0.05}
"""The second cost set: generated and simulated under it (cost-aware generators see it)."""


def modelled_key(system: str, model: str, hw: str, gpus: int) -> str:
    return f"{system} {model} {hw} x{gpus}"


@dataclass(frozen=True)
class KeyPatterns:
    """A ``keys`` filter for ``FigureSet.compute``: the keys matching any of ``patterns`` (shell wildcards,
    ``fnmatch``), so a filter can name figures no baseline holds yet (``--key '* h200 x8'``). Hashable: the
    schedule timelines are cached per filter."""

    patterns: tuple[str, ...]

    def __contains__(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.patterns)


def modelled_keys() -> list[tuple[str, str, str, int]]:
    """(system, model, hardware, gpus) of every modelled figure."""
    return ([(s, *p) for p in MODELLED_POINTS for s in MODELLED_SYSTEMS]
            + [(s, *p) for p in STAGE_BOUND_POINTS for s in STAGE_BOUND_SYSTEMS])


def compute_modelled(keys: set | None = None) -> dict[str, dict[str, float]]:
    from bench.modelled import predict
    from bench.modelled.report import point

    out: dict[str, dict[str, float]] = {"tokens_per_s": {}, "max_seq_len": {}}
    for system, model, hw, gpus in modelled_keys():
        key = modelled_key(system, model, hw, gpus)
        if keys is not None and key not in keys:
            continue
        p = predict(system, point(model, hw, gpus))
        out["tokens_per_s"][key] = round(p.tokens_per_s, 3)
        out["max_seq_len"][key] = p.max_seq_len
    return out


@functools.lru_cache(maxsize=4)
def _timelines(keys: frozenset | None) -> tuple:
    """(key, simulated timeline) pairs; cached: ``schedules`` and ``ratios`` share one computation."""
    return tuple(_simulate_grid(keys))


def _simulate_grid(keys: frozenset | None):
    from bubbleless_schedules import Costs, available, generate, simulate

    costs = {"unit": Costs.unit(), "uneven": Costs(**UNEVEN)}
    for name in available():
        for p, m in SCHEDULE_SHAPES:
            for label, c in costs.items():
                key = f"{name} p{p} m{m} {label}"
                base = f"1f1b p{p} m{m} {label}"
                if keys is not None and key not in keys and base not in keys:
                    continue
                try:
                    schedule = generate(name, num_ranks=p, num_microbatches=m, costs=c)
                except ValueError:
                    continue  # a shape this generator does not support: no figure
                yield key, simulate(schedule, c)


def _frozen(keys):
    return keys if keys is None or isinstance(keys, KeyPatterns) else frozenset(keys)


def compute_schedules(keys: set | None = None) -> dict[str, dict[str, float]]:
    return {"makespan": {key: round(t.makespan, 6) for key, t in _timelines(_frozen(keys))}}


def compute_ratios(keys: set | None = None) -> dict[str, dict[str, float]]:
    timelines = dict(_timelines(_frozen(keys)))
    speedup, bubble = {}, {}
    for key, t in timelines.items():
        if keys is not None and key not in keys:
            continue
        base = timelines["1f1b " + key.split(" ", 1)[1]]
        speedup[key] = round(base.makespan / t.makespan, 6)
        bubble[key] = round(t.bubble_rate, 6)
    return {"speedup_over_1f1b": speedup, "bubble_rate": bubble}


FIGURE_SETS = (
    FigureSet(name="modelled", groups={"tokens_per_s": HIGHER, "max_seq_len": HIGHER}, compute=compute_modelled,
              about="Modelled (not measured) tokens/s and longest sequence, seq 2048, 32 sequences per step, bf16: "
                    "bench/figures.py MODELLED_POINTS x MODELLED_SYSTEMS and STAGE_BOUND_POINTS x "
                    "STAGE_BOUND_SYSTEMS; `python bench/model.py ... --json` reproduces each."),
    FigureSet(name="schedules", groups={"makespan": LOWER}, compute=compute_schedules,
              about="Simulated makespans of every registered schedule at (p, m) in bench/figures.py "
                    "SCHEDULE_SHAPES, unit costs and the UNEVEN costs (generated and simulated under them)."),
    FigureSet(name="ratios", groups={"speedup_over_1f1b": HIGHER, "bubble_rate": LOWER}, compute=compute_ratios,
              about="Per schedule and shape: 1F1B's simulated makespan over its own, and its bubble rate."),
)
