"""Published model shapes as ``TransformerShape``s, for modelled runs on hardware we do not have.

Each shape copies the fields of the model's published Hugging Face ``config.json`` (repository named in
``source``): ``hidden_size`` -> hidden, ``intermediate_size`` -> intermediate, ``num_hidden_layers`` ->
num_layers, ``num_attention_heads`` -> heads, ``num_key_value_heads`` -> kv_heads, ``head_dim``,
``vocab_size`` -> vocab, ``tie_word_embeddings``; for MoE ``num_experts`` -> experts,
``num_experts_per_tok`` -> top_k, ``moe_intermediate_size`` -> expert_intermediate. The numbers were
transcribed, not downloaded in the session that wrote them; the check that they are right is that the
parameter counts come out as the models' names say (tests/test_part_hardware_shapes.py: 1.72B, 8.03B,
32.8B, 235B with 22B active).
"""

from __future__ import annotations

from .analytic import TransformerShape

QWEN3_1_7B = TransformerShape(
    name="Qwen3-1.7B", num_layers=28, hidden=2048, intermediate=6144, heads=16, kv_heads=8, head_dim=128,
    vocab=151_936, tied_embeddings=True,
    source="huggingface.co/Qwen/Qwen3-1.7B config.json: hidden_size 2048, intermediate_size 6144, "
           "num_hidden_layers 28, num_attention_heads 16, num_key_value_heads 8, head_dim 128, "
           "vocab_size 151936, tie_word_embeddings true",
)

LLAMA_3_1_8B = TransformerShape(
    name="Llama-3.1-8B", num_layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
    vocab=128_256,
    source="huggingface.co/meta-llama/Llama-3.1-8B config.json: hidden_size 4096, intermediate_size 14336, "
           "num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, vocab_size 128256, "
           "tie_word_embeddings false (no head_dim key: hidden_size / num_attention_heads = 128)",
)

QWEN3_32B = TransformerShape(
    name="Qwen3-32B", num_layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128,
    vocab=151_936,
    source="huggingface.co/Qwen/Qwen3-32B config.json: hidden_size 5120, intermediate_size 25600, "
           "num_hidden_layers 64, num_attention_heads 64, num_key_value_heads 8, head_dim 128, "
           "vocab_size 151936, tie_word_embeddings false",
)

QWEN3_235B_A22B = TransformerShape(
    name="Qwen3-235B-A22B", num_layers=94, hidden=4096, intermediate=12288, heads=64, kv_heads=4, head_dim=128,
    vocab=151_936, experts=128, top_k=8, expert_intermediate=1536,
    source="huggingface.co/Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, intermediate_size 12288 "
           "(dense width, unused: decoder_sparse_step 1 and mlp_only_layers [] make every layer MoE), "
           "moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8, num_hidden_layers 94, "
           "num_attention_heads 64, num_key_value_heads 4, head_dim 128, vocab_size 151936, "
           "tie_word_embeddings false",
)

SHAPES = {
    "qwen3-1.7b": QWEN3_1_7B,
    "llama-3.1-8b": LLAMA_3_1_8B,
    "qwen3-32b": QWEN3_32B,
    "qwen3-235b-a22b": QWEN3_235B_A22B,
}
"""The shapes by the names the bench command line uses."""


def shape(name: str) -> TransformerShape:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(SHAPES)} (or build a TransformerShape(...))")
    return SHAPES[name]
