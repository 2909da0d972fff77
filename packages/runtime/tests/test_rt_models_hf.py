"""The cut layers, run one after another, reproduce the Hugging Face model: logits, loss, MoE aux loss."""

import os

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime._testing import tiny_hf_fields  # noqa: E402
from bubbleless_runtime.models import build_causal_lm, pipeline_model  # noqa: E402

TINY = tiny_hf_fields(vocab_size=128, num_hidden_layers=3)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, router_aux_loss_coef=0.02)


def run_layers(layers, x):
    for layer in layers:
        x = layer(x)
    return x


@pytest.mark.parametrize(
    "architecture,fields",
    [
        ("llama", {k: v for k, v in TINY.items() if k != "head_dim"}),
        ("qwen3", TINY),
        ("qwen3", {**TINY, "tie_word_embeddings": True}),
        ("qwen3", {**TINY, "attn_implementation": "eager"}),
    ],
)
def test_dense_layers_match_hf_logits_and_loss(architecture, fields):
    model = build_causal_lm(architecture, seed=0, **fields).eval()
    piped = pipeline_model(model)
    ids = torch.randint(0, 128, (3, 10), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :4] = -100
    reference = model(input_ids=ids, labels=labels)
    logits = run_layers(piped.layers, ids)
    torch.testing.assert_close(logits, reference.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(piped.loss_fn(logits, labels), reference.loss, rtol=1e-5, atol=1e-6)
    assert len(piped.layers) == fields["num_hidden_layers"] + 2


def test_layers_are_causal():
    """Changing a later token must not change earlier logits (the mask is really applied)."""
    model = build_causal_lm("qwen3", seed=0, **{**TINY, "attn_implementation": "eager"}).eval()
    layers = pipeline_model(model).layers
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 128
    a, b = run_layers(layers, ids), run_layers(layers, changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_moe_layers_match_hf_including_aux_loss():
    model = build_causal_lm("qwen3_moe", seed=0, **TINY, **MOE).eval()
    piped = pipeline_model(model)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    reference = model(input_ids=ids, labels=ids, output_router_logits=True)
    logits, stats = run_layers(piped.layers, ids)
    torch.testing.assert_close(logits, reference.logits, rtol=1e-5, atol=1e-5)
    aux = piped.loss_fn.aux_loss(stats, tokens_per_sample=ids.shape[1])
    torch.testing.assert_close(aux, reference.aux_loss, rtol=1e-5, atol=1e-6)
    assert reference.aux_loss > 0
    torch.testing.assert_close(piped.loss_fn((logits, stats), ids), reference.loss, rtol=1e-5, atol=1e-6)


def test_moe_aux_loss_gradient_reaches_the_router():
    model = build_causal_lm("qwen3_moe", seed=0, **TINY, **MOE)
    piped = pipeline_model(model, aux_loss_coef=1.0)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(4))
    _, stats = run_layers(piped.layers, ids)
    piped.loss_fn.aux_loss(stats, tokens_per_sample=6).backward()
    router = model.model.layers[0].mlp.gate.weight
    assert router.grad is not None and router.grad.abs().sum() > 0


def test_saved_model_loads_from_local_path(tmp_path):
    from bubbleless_runtime.models import load_causal_lm

    model = build_causal_lm("qwen3", seed=0, **TINY).eval()
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(tmp_path).eval()
    ids = torch.randint(0, 128, (1, 5))
    torch.testing.assert_close(run_layers(pipeline_model(loaded).layers, ids), model(input_ids=ids).logits)


def test_bad_input_raises_value_error(tmp_path):
    from bubbleless_runtime.models import load_causal_lm

    with pytest.raises(ValueError, match="unknown architecture"):
        build_causal_lm("gpt5")
    with pytest.raises(ValueError, match="not a local directory"):
        load_causal_lm(tmp_path / "missing")
    with pytest.raises(ValueError, match="cannot cut"):
        pipeline_model(torch.nn.Linear(2, 2))
