"""partition -> schedules -> runtime: a cut computed from a profile is what the pipeline runs, and the
simulator prices it.

The profile is analytic (``bubbleless_partition.analytic_profile``) for a tiny Qwen3 whose vocabulary
(8192 rows at width 32) makes the LM head far heavier than the decoder layers, so the min-max cut is
not the even one. The runtime builds the same shape with transformers, cuts it where the partition
package said, runs 1F1B on 2 gloo ranks and must give the unpipelined model's gradients. The simulator,
fed the cut's per-stage costs, must predict a shorter step than for the even cut.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_partition import RTX_4090, TransformerShape, analytic_profile, cut  # noqa: E402
from bubbleless_runtime import spawn  # noqa: E402
from bubbleless_runtime._testing import tiny_hf_fields  # noqa: E402
from bubbleless_runtime._testing.cross import cut_causal_lm_against_unpipelined  # noqa: E402
from bubbleless_runtime.auto_partition import stage_costs  # noqa: E402
from bubbleless_runtime.stages import stage_sizes  # noqa: E402
from bubbleless_schedules import generate, simulate  # noqa: E402

FIELDS = tiny_hf_fields(vocab_size=8192, num_hidden_layers=4, tie_word_embeddings=False)
SHAPE = TransformerShape(
    name="tiny-qwen3", num_layers=4, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=8192
)


def _profile_and_cut():
    profile = analytic_profile(SHAPE, RTX_4090, seq_len=10, micro_batch_size=2)
    return profile, cut(profile, num_stages=2, method="dp")


def test_cross_the_profile_has_the_runtimes_layers_and_the_cut_is_uneven():
    profile, part = _profile_and_cut()
    assert profile.num_layers == FIELDS["num_hidden_layers"] + 2  # embedding, decoders, norm + LM head
    assert list(part.sizes) != stage_sizes(profile.num_layers, 2)
    assert part.sizes[-1] < part.sizes[0]  # the heavy head stands nearly alone


def test_cross_the_simulator_prices_the_cut_below_the_even_one():
    profile, part = _profile_and_cut()
    schedule = generate("1f1b", num_ranks=2, num_microbatches=4)
    cut_step = simulate(schedule, stage_costs(profile, part.sizes)).makespan
    even_step = simulate(schedule, stage_costs(profile, stage_sizes(profile.num_layers, 2))).makespan
    assert cut_step < even_step
    # one stage per rank: the step is at least the busiest stage's F + I + W over the 4 micro-batches
    costs = stage_costs(profile, part.sizes)
    busiest = max(costs.forward[s] + costs.backward_input[s] + costs.backward_weight[s] for s in range(2))
    assert cut_step >= 4 * busiest * (1 - 1e-9)


@pytest.mark.slow
def test_cross_the_cut_runs_on_two_ranks_with_the_unpipelined_gradients():
    _, part = _profile_and_cut()
    per_rank = spawn(cut_causal_lm_against_unpipelined, 2, FIELDS, "1f1b", list(part.sizes),
                     threads_per_process=1, timeout=180)
    for rank, result in enumerate(per_rank):
        assert result["partition"] == list(part.sizes), (rank, result)
        assert result["layers_here"] == [part.sizes[rank]], (rank, result)
        assert result["checked"] > 0 and result["grad_error"] <= 1e-4, (rank, result)
