"""bench.modelled.report's Grid: the progress bar of `bench/model.py --table` ticks once per prediction it
computes, naming the point while it runs, and not again for a cached one (the report asks for most points
several times: the headline, the per-hardware tables, the plots); the slow points computed over several
processes first are the predictions computed in process."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.modelled.report import Grid, slow_keys  # noqa: E402


class RecordingBar:
    def __init__(self):
        self.ticks, self.postfixes = 0, []

    def update(self, n: int = 1):
        self.ticks += n

    def set_postfix_str(self, text: str):
        self.postfixes.append(text)


def test_modelled_report_grid_ticks_once_per_computed_prediction():
    bar = RecordingBar()
    grid = Grid({}, bar)
    first = grid.get("zero2", "qwen3-1.7b", "a800", 8)
    again = grid.get("zero2", "qwen3-1.7b", "a800", 8)
    grid.get("zero2", "qwen3-1.7b", "a800", 4)
    assert again is first
    assert bar.ticks == 2
    assert bar.postfixes == ["zero2 qwen3-1.7b 8x a800", "zero2 qwen3-1.7b 4x a800"]
    grid.get("zero2", "qwen3-1.7b", "a800", 4, seq_len=4096)
    assert bar.ticks == 3 and bar.postfixes[-1] == "zero2 qwen3-1.7b 4x a800 seq 4096"


def test_modelled_report_grid_without_a_bar_still_caches():
    grid = Grid({})
    assert grid.get("1f1b", "qwen3-1.7b", "a800", 8) is grid.get("1f1b", "qwen3-1.7b", "a800", 8)


def test_modelled_report_prefetch_over_processes_gives_the_in_process_predictions():
    keys = [("zero2", "qwen3-1.7b", "a800", 8, 2048), ("1f1b", "llama-3.1-8b", "rtx4090", 4, 4096)]
    bar = RecordingBar()
    fetched = Grid({}, bar)
    fetched.prefetch(keys, jobs=2)
    assert bar.ticks == 2 and set(fetched.cache) == set(keys)
    assert sorted(bar.postfixes) == ["done 1f1b llama-3.1-8b 4x rtx4090 seq 4096", "done zero2 qwen3-1.7b 8x a800"]
    computed = Grid({})
    for key in keys:
        system, model, hw, gpus, seq_len = key
        assert fetched.cache[key] == computed.get(system, model, hw, gpus, seq_len=seq_len)


def test_modelled_report_slow_keys_are_the_round_robin_points_the_report_asks_for():
    keys = slow_keys()
    assert {k[0] for k in keys} == {"roundrobin", "roundrobin-sync"}
    # 8 GPUs of 4 profiles, the scaling, the headline's synchronous column, the sweep
    assert len(keys) == len(set(keys)) == 4 * 4 + 4 * 3 + 4 + 5
    assert len(slow_keys(plots=False)) == len(keys) - 5  # the sequence sweep only feeds a plot
