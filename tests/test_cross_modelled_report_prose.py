"""bench.modelled.report's prose quotes the round-robin plan of its headline rows (the fused last group's
layers and GPUs) rather than literals that go stale when the planner changes its cut."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # bench/ is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from bench.modelled import Point, predict  # noqa: E402
from bench.modelled.common import Prediction  # noqa: E402
from bench.modelled.report import SEQ_LEN, Grid, why  # noqa: E402
from bubbleless_partition import A800, shape  # noqa: E402


def _planned(layers: int, gpus: int) -> Prediction:
    return Prediction(system="roundrobin", tokens_per_s=1.0, step_s=1.0, max_seq_len=1, peak_device_bytes=1.0,
                      details={"fused_last_group_layers": layers, "fused_last_group_gpus": gpus})


def test_modelled_report_prose_quotes_each_rows_own_plan():
    grid = Grid({("roundrobin", "qwen3-1.7b", "rtx4090", 8, SEQ_LEN): _planned(21, 6),
                 ("roundrobin", "qwen3-32b", "rtx4090", 8, SEQ_LEN): _planned(1, 1)})
    text = " ".join(why(grid))
    assert ("(Qwen3-1.7B: a 21-layer fused group over six GPUs; the column 'fused last group alone' is the "
            "busiest GPU's share; Qwen3-32B keeps only the head in it, over one GPU)") in text
    assert "24-layer" not in text and "FUSED_GROUPS" not in text
    grid.cache[("roundrobin", "qwen3-1.7b", "rtx4090", 8, SEQ_LEN)] = _planned(24, 12)
    assert "Qwen3-1.7B: a 24-layer fused group over 12 GPUs;" in " ".join(why(grid))


def test_modelled_roundrobin_details_name_the_fused_last_group_of_its_plan():
    small = Point(shape=shape("qwen3-1.7b"), hardware=A800, gpus=2, seq_len=512, global_batch=4)
    p = predict("roundrobin", small)
    [last] = re.findall(r" last (\d+) ", p.notes[0])  # the plan note: "groups fwd [...] last N bwd [...]"
    assert p.details["fused_last_group_layers"] == int(last)
    assert 1 <= p.details["fused_last_group_gpus"] <= small.gpus


def test_modelled_report_prose_says_what_host_memory_the_longest_sequences_need():
    small = Point(shape=shape("qwen3-1.7b"), hardware=A800, gpus=2, seq_len=512, global_batch=4)
    p = predict("roundrobin", small)
    from bench.modelled.ours_pool import pool_host_bytes

    state, inputs = pool_host_bytes(small, p.max_seq_len)
    assert (p.details["host_state_bytes"], p.details["host_inputs_bytes_at_max_seq"]) == (state, inputs)
    assert inputs == 2 * (28 + 1) * p.max_seq_len * 2048 * 2  # one sequence per GPU, every layer's input, bf16
    assert state == small.shape.parameter_count() * (18 + 6)  # working, master, grad, 2 moments; async's spare
    assert any(f"at least: {state / 1e9:,.0f} GB of model state" in note for note in p.notes)
    grid = Grid({("roundrobin", "qwen3-1.7b", "rtx4090", 8, SEQ_LEN): p,  # the 32B row planned without them
                 ("roundrobin", "qwen3-32b", "rtx4090", 8, SEQ_LEN): _planned(1, 2)})
    assert (f"At them it needs at least (8x RTX 4090): Qwen3-1.7B {(state + inputs) / 1e9:,.0f} GB "
            f"({state / 1e9:,.0f} of state).") in " ".join(why(grid))
