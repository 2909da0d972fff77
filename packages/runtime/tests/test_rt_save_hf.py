"""Results users can load: a pipelined full fine-tuning saves a save_pretrained directory whose logits
are the trained model's; a LoRA model saves merged, loadable without peft; the tokenizer goes along."""

import os
import sys

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))  # _data_fixtures, beside this file

from _data_fixtures import tiny_tokenizer  # noqa: E402

from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402
from bubbleless_runtime.save_hf import save_pretrained_model  # noqa: E402

TINY = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


def batch():
    ids = torch.randint(0, 300, (4, 12), generator=torch.Generator().manual_seed(0))
    return ids, ids.clone()


def _rank(rank, port, out):
    import torch.distributed as dist

    from bubbleless_runtime.pipeline import Pipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = build_causal_lm("llama", seed=0, **TINY)
        piped = pipeline_model(model)
        pipe = Pipeline(piped.layers, schedule="1f1b", num_microbatches=2, loss_fn=piped.loss_fn)
        optimizer = torch.optim.SGD(pipe.parameters(), lr=0.5)
        pipe.step(*batch())
        optimizer.step()
        save_pretrained_model(model, out, owned=list(pipe.parameters()), tokenizer_from=os.path.join(out, "..", "tok"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_pipelined_full_fine_tuning_saves_what_trained(tmp_path):
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bubbleless_runtime._testing import free_port

    tiny_tokenizer().save_pretrained(tmp_path / "tok")
    out = tmp_path / "model"
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=2, start_method="fork")
    # the same step unpipelined
    want = build_causal_lm("llama", seed=0, **TINY)
    ids, labels = batch()
    piped = pipeline_model(want)
    for i, y in zip(ids.chunk(2), labels.chunk(2), strict=True):
        x = i
        for layer in piped.layers:
            x = layer(x)
        piped.loss_fn(x, y).backward()
    with torch.no_grad():
        for p in want.parameters():
            p -= 0.5 * p.grad
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    assert AutoTokenizer.from_pretrained(out, local_files_only=True).chat_template
    untrained = build_causal_lm("llama", seed=0, **TINY)
    with torch.no_grad():
        got, expected, before = (m(input_ids=ids).logits for m in (loaded, want, untrained))
    assert not torch.allclose(before, expected)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_lora_saves_merged_and_loads_without_peft(tmp_path):
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from bubbleless_runtime.lora import apply_lora

    model = apply_lora(build_causal_lm("llama", seed=0, **TINY), rank=4, alpha=8)
    ids, labels = batch()
    layers = pipeline_model(model).layers
    x = ids
    for layer in layers:
        x = layer(x)
    pipeline_model(model).loss_fn(x, labels).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 1.0 * p.grad
        trained = model(input_ids=ids).logits
    save_pretrained_model(model, tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True)
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trained, rtol=1e-4, atol=1e-5)
