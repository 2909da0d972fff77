"""Test fixtures for the data tests: a tiny byte-level BPE tokenizer with a ChatML chat template, built
in code (nothing downloaded), and JSONL writers."""

from __future__ import annotations

import json

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "What is 2 plus 3? It is 5.", "The capital of France is Paris.", "Convert 3 km to metres: 3000 m.",
    "hello world, the quick brown fox jumps over the lazy dog", "system user assistant",
]


def tiny_tokenizer(vocab_size: int = 300):
    """A PreTrainedTokenizerFast (byte-level BPE trained on a few sentences), with pad, eos and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = CHATML
    return tokenizer


def write_jsonl(path, records) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return str(path)


def chats(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus {i + 1}?"},
                          {"role": "assistant", "content": f"It is {2 * i + 1}."}]} for i in range(n)]


def pairs(n: int) -> list[dict]:
    return [{"prompt": f"Convert {i} km to metres: ", "completion": f"{1000 * i} m"} for i in range(n)]
