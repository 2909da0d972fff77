"""bench/scenarios/tiny.yaml, the full measured run: it lists zbv-mem (zbv on the measured V cut at torch
1F1B's memory) beside zbv, so the report's zbv-mem rows are measured in every run, and each system it lists
has a runner."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.measured.runner import _runner  # noqa: E402
from bench.measured.scenario import load_scenario  # noqa: E402


def test_cross_bench_tiny_scenario_runs_zbv_mem_and_every_system_it_lists_has_a_runner():
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "tiny.yaml")
    assert {"zbv", "zbv-mem"} <= set(scenario.systems)
    for system in scenario.systems:
        assert callable(_runner(system)), system
