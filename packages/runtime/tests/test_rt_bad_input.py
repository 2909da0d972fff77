"""Bad input raises ValueError saying what to change, on every rank, before any communication."""

from __future__ import annotations

import pytest
import torch

from bubbleless_runtime import Pipeline, spawn
from bubbleless_runtime._testing import stages_on_one_rank, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime._testing.ranks import bad_input_then_good_step
from bubbleless_schedules import generate

OK = dict(schedule="1f1b", num_microbatches=2, loss_fn=tiny_loss)


def test_rt_schedule_for_other_rank_count():
    schedule = generate("1f1b", num_ranks=2, num_microbatches=2)
    with pytest.raises(ValueError, match="is for 2 ranks but the pipeline group has 1"):
        Pipeline(tiny_model(3), **{**OK, "schedule": schedule})


def test_rt_schedule_with_other_microbatch_count():
    schedule = generate("1f1b", num_ranks=1, num_microbatches=4)
    with pytest.raises(ValueError, match="pass num_microbatches=4"):
        Pipeline(tiny_model(3), **{**OK, "schedule": schedule})


def test_rt_missing_loss_fn():
    with pytest.raises(ValueError, match="loss_fn is required"):
        Pipeline(tiny_model(3), **{**OK, "loss_fn": None})


def test_rt_microbatches_must_divide_the_batch():
    pipe = Pipeline(tiny_model(3), **OK)
    with pytest.raises(ValueError, match="multiple of 2"):
        pipe.step(*tiny_batch(5))


def test_rt_targets_must_have_the_inputs_batch_size():
    """Both sizes divide the micro-batches, so only comparing them catches it (the loss would broadcast)."""
    pipe = Pipeline(tiny_model(3), **OK)
    inputs, targets = tiny_batch(4)
    with pytest.raises(ValueError, match=r"same batch size \(dim 0\), got inputs\[0\] 4, targets\[0\] 2"):
        pipe.step(inputs, targets[:2])
    with pytest.raises(ValueError, match="inputs\\[1\\] 2"):
        pipe.step((inputs, inputs[:2]), targets)


def test_rt_roundrobin_is_refused_naming_the_schedules_that_run():
    with pytest.raises(ValueError, match="roundrobin dispatches stage jobs to a device pool") as caught:
        Pipeline(tiny_model(3), **{**OK, "schedule": "roundrobin"})
    names = str(caught.value).split("Pipeline runs stage-bound schedules; pick one of ")[1]
    assert "'1f1b'" in names and "'zbv'" in names and "'roundrobin'" not in names


@pytest.mark.parametrize(
    ("model", "partition", "match"),
    [
        (torch.nn.Linear(2, 2), None, "nn.Sequential or a list of layers"),
        (tiny_model(1), None, "at least 2 layers"),
        (tiny_model(4), [4], "gives 1 stages but the schedule has 2"),
        (tiny_model(4), [1, 2], "make the counts sum to 4"),
        (tiny_model(4), [0, 4], "at least one layer"),
    ],
)
def test_rt_model_that_cannot_be_cut(model, partition, match):
    with pytest.raises(ValueError, match=match):
        Pipeline(model, **{**OK, "schedule": stages_on_one_rank(2)}, partition=partition)


def test_rt_single_process_with_a_partition_matches_the_model():
    model, ref = tiny_model(4), tiny_model(4)
    pipe = Pipeline(model, **{**OK, "schedule": stages_on_one_rank(2)}, partition=[1, 3])
    inputs, targets = tiny_batch(4)
    loss = pipe.step(inputs, targets)
    ref_loss = sum(tiny_loss(ref(x), y) for x, y in zip(inputs.chunk(2), targets.chunk(2), strict=True))
    ref_loss.backward()
    assert torch.allclose(loss, ref_loss.detach())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)
    assert [len(m) for m in pipe.modules] == [1, 3] and pipe.modules[1][0] is model[1]  # the caller's layers


@pytest.mark.slow
def test_rt_every_rank_raises_before_communicating():
    per_rank = spawn(bad_input_then_good_step, 2, threads_per_process=1, timeout=60)
    for messages in per_rank:
        assert "no error" not in messages, messages
        assert any("launch 3 processes" in m for m in messages)
        assert any("multiple of 2" in m for m in messages)
        assert any("same batch size" in m for m in messages)  # found on every rank, not only the last


def _damaged(kind: str):
    schedule = stages_on_one_rank(2)
    row = list(schedule.actions[0])
    if kind == "cycle":  # a backward before the forward it needs: nothing can ever run it
        row.insert(0, row.pop(row.index(next(a for a in row if a.kind.value == "B"))))
    else:
        row.pop()  # the last backward is missing
    return schedule.replace(actions=(tuple(row),))


@pytest.mark.parametrize(("kind", "match"), [("cycle", r"deadlock: worker 0 waits at"),
                                             ("missing", r"incomplete schedule \(validate needs every action")])
def test_rt_an_invalid_schedule_is_refused_with_the_validators_message(kind, match):
    """Issue 9: a given Schedule is validated in the constructor, before any step (was a KeyError mid-step)."""
    with pytest.raises(ValueError, match=match) as info:
        Pipeline(tiny_model(3), **{**OK, "schedule": _damaged(kind)})
    assert "worker 0:" in str(info.value)  # the rendered schedule, the failing action marked


def test_rt_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_spawning(tmp_path):
    """Issue 9: data.path with a tokenizer of more ids than model.path's embedding rows (an IndexError deep
    inside the first step before) says so, and how to fix it, before any process starts."""
    import os
    import sys

    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(__file__))  # _data_fixtures, beside this file
    from _data_fixtures import chats, tiny_tokenizer, write_jsonl

    from bubbleless_runtime.config import load_config
    from bubbleless_runtime.config_runtime import check_before_run
    from bubbleless_runtime.models import build_causal_lm

    tokenizer = tiny_tokenizer(300)
    model = build_causal_lm("qwen3", vocab_size=len(tokenizer) - 20, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    data = write_jsonl(tmp_path / "chats.jsonl", chats(4))
    config = load_config(text=f"model: {{path: {tmp_path / 'model'}}}\ndata: {{path: {data}, seq_len: 64}}\n"
                              f"train: {{output_dir: {tmp_path / 'out'}}}\n")
    with pytest.raises(ValueError, match=rf"the tokenizer of model.path .* has {len(tokenizer)} tokens but the model's "
                                         rf"vocab_size is {len(tokenizer) - 20}: .*resize_token_embeddings"):
        check_before_run(config, num_ranks=2)
    model.resize_token_embeddings(len(tokenizer))  # the advice, followed
    model.save_pretrained(tmp_path / "model")
    check_before_run(config, num_ranks=2)
