"""model.path loads a local Hugging Face directory in model.dtype, for the architectures we cut only;
model_from_config builds every architecture of the one table from a ModelConfig."""

import os

import pytest
import torch

pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bubbleless_runtime.config import ModelConfig  # noqa: E402
from bubbleless_runtime.models import ARCHITECTURES, build_causal_lm, model_from_config, pipeline_model  # noqa: E402

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_path_loads_in_the_asked_dtype(tmp_path, dtype):
    saved = build_causal_lm("llama", seed=0, **TINY)
    saved.save_pretrained(tmp_path)
    model, aux = model_from_config(ModelConfig(path=str(tmp_path), dtype=dtype))
    assert aux is None and type(model).__name__ == "LlamaForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.float32 if dtype == "fp32" else torch.bfloat16}
    ids = torch.randint(0, 64, (2, 8))
    x = ids
    for layer in pipeline_model(model).layers:
        x = layer(x)
    want = saved(input_ids=ids).logits
    torch.testing.assert_close(x.float(), want, rtol=0, atol=0 if dtype == "fp32" else 0.1)


def test_path_errors(tmp_path):
    with pytest.raises(ValueError, match="not a local directory"):
        model_from_config(ModelConfig(path=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="no config.json"):
        model_from_config(ModelConfig(path=str(tmp_path)))
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'gpt2' model; the pipeline cuts"):
        model_from_config(ModelConfig(path=str(tmp_path)))


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_every_architecture_builds_from_sizes_and_cuts(architecture):
    config = ModelConfig(architecture=architecture, num_layers=2, vocab_size=40)
    model, aux = model_from_config(config, seed=0)
    assert model.config.model_type == architecture and model.config.num_hidden_layers == 2
    assert (aux is not None) == ARCHITECTURES[architecture].moe
    assert len(pipeline_model(model).layers) == 4
