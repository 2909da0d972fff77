"""``bubbleless generate --model DIR --prompt "..."``: what a trained model says, in a few tokens.

``DIR`` is a local Hugging Face model directory (``save_pretrained`` output: ``config.json``, weights,
tokenizer) or a LoRA adapter directory (peft's ``adapter_config.json``), whose base model comes from
the adapter config's ``base_model_name_or_path`` or ``--base DIR``. Nothing is downloaded: every path
must be a local directory. Greedy decoding by default (the same tokens ``model.generate`` gives);
``--sample`` draws with ``--temperature`` and ``--top-p`` from ``--seed``. ``--chat`` wraps the prompt
as one user turn in the tokenizer's chat template. Prints only the completion.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any one of these marks a directory that ``AutoTokenizer.from_pretrained`` can load."""


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """How to continue the prompt."""

    max_new_tokens: int = 32
    """Tokens to generate at most (fewer when the model ends its answer with its end-of-sequence token)."""
    sample: bool = False
    """False: greedy (the most likely token each step). True: draw from the distribution."""
    temperature: float = 1.0
    """Sampling only: divides the logits; below 1 sharpens, above 1 flattens. Must be > 0."""
    top_p: float = 1.0
    """Sampling only: draw from the smallest set of tokens whose probabilities add up to this (nucleus)."""
    seed: int = 0
    """Sampling only: seeds torch's generator, so the same seed draws the same text."""
    chat: bool = False
    """Wrap the prompt as one user message in the tokenizer's chat template (with the generation prompt)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be above 0, got {self.temperature} (for greedy drop --sample)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")


def _has_tokenizer(directory: str | None) -> bool:
    return directory is not None and any(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES)


def _local_dir(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise ValueError(f"{what} {path!r} does not exist; give a local directory (nothing is downloaded)")
    if not os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a file; give the directory save_pretrained wrote")
    return path


def adapter_base(model_dir: str, base: str | None) -> str:
    """The base model directory of the LoRA adapter in ``model_dir``: ``base`` when given, else the
    adapter config's ``base_model_name_or_path``."""
    if base is None:
        with open(os.path.join(model_dir, "adapter_config.json")) as file:
            base = json.load(file).get("base_model_name_or_path") or None
        if base is None:
            raise ValueError(f"the adapter in {model_dir} does not name its base model "
                             "(base_model_name_or_path is empty): pass --base DIR")
        if not os.path.isabs(base) and not os.path.isdir(base):  # relative to where the run was launched
            raise ValueError(f"the adapter in {model_dir} names its base model by the relative path {base!r}, "
                             f"which is not a directory from here ({os.getcwd()}): run from where training ran, "
                             "or pass --base DIR")
    _local_dir(base, "the adapter's base model")
    if not os.path.isfile(os.path.join(base, "config.json")):
        raise ValueError(f"the adapter's base model {base!r} has no config.json; pass --base DIR with the model "
                         "the adapter was trained on")
    return base


def load_for_generation(model_dir: str, *, base: str | None = None, tokenizer_dir: str | None = None):
    """(model in eval mode, tokenizer) from a model directory or an adapter directory; ValueError that says
    what is missing and what to pass."""
    _local_dir(model_dir, "--model")
    adapter = os.path.isfile(os.path.join(model_dir, "adapter_config.json"))
    if not adapter and not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir} has no config.json: it is neither a Hugging Face model directory "
                         "(what save_pretrained writes) nor a LoRA adapter (adapter_config.json)")
    if not adapter and base is not None:
        raise ValueError(f"--base is for LoRA adapters, and {model_dir} is a full model (no adapter_config.json)")
    base_dir = adapter_base(model_dir, base) if adapter else None
    if tokenizer_dir is not None:
        _local_dir(tokenizer_dir, "--tokenizer")
    source = next((d for d in (tokenizer_dir, model_dir, base_dir) if _has_tokenizer(d)), None)
    if source is None:
        where = model_dir if base_dir is None else f"{model_dir} nor in its base model {base_dir}"
        raise ValueError(f"no tokenizer in {where} (none of {', '.join(TOKENIZER_FILES)}): save one beside the "
                         "model (tokenizer.save_pretrained(DIR)) or pass --tokenizer DIR")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(base_dir or model_dir, local_files_only=True)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, model_dir, local_files_only=True)
    return model.eval(), tokenizer


def prompt_ids(tokenizer, prompt: str, *, chat: bool):
    """The prompt as a (1, length) token tensor and its attention mask."""
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template: drop --chat to feed the prompt as plain text")
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    if encoded["input_ids"].shape[-1] == 0:
        raise ValueError(f"the prompt {prompt!r} is no tokens at all; give some text")
    return encoded["input_ids"], encoded.get("attention_mask")


def generate_text(model, tokenizer, prompt: str, settings: GenerationSettings | None = None) -> str:
    """The completion of ``prompt`` (the new tokens only, decoded without special tokens)."""
    import torch

    settings = settings or GenerationSettings()
    ids, mask = prompt_ids(tokenizer, prompt, chat=settings.chat)
    device = next(model.parameters()).device
    ids = ids.to(device)
    mask = None if mask is None else mask.to(device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if settings.sample:
        torch.manual_seed(settings.seed)
        knobs = dict(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=0)
    else:
        knobs = dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=settings.max_new_tokens,
                             pad_token_id=pad, **knobs)
    return tokenizer.decode(out[0, ids.shape[-1]:], skip_special_tokens=True)


def add_generate_parser(commands) -> argparse.ArgumentParser:
    """The ``generate`` subcommand on ``bubbleless``'s subparsers."""
    parser = commands.add_parser("generate", help="continue a prompt with a trained model (or LoRA adapter)")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="a Hugging Face model directory (save_pretrained) or a LoRA adapter directory")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--base", metavar="DIR",
                        help="an adapter's base model (default: base_model_name_or_path of adapter_config.json)")
    parser.add_argument("--tokenizer", metavar="DIR", help="load the tokenizer from here (default: --model, then --base)")
    parser.add_argument("--max-new-tokens", type=int, default=GenerationSettings.max_new_tokens,
                        help=f"tokens to generate at most (default {GenerationSettings.max_new_tokens})")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, help="with --sample (default 1.0)")
    parser.add_argument("--top-p", type=float, help="with --sample: nucleus mass (default 1.0)")
    parser.add_argument("--seed", type=int, help="with --sample (default 0)")
    return parser


def settings_from_args(args: argparse.Namespace) -> GenerationSettings:
    knobs = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    given = [name for name, value in knobs.items() if value is not None]
    if given and not args.sample:
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} only applies when sampling: add --sample (greedy decoding has no {flag})")
    return GenerationSettings(max_new_tokens=args.max_new_tokens, sample=args.sample, chat=args.chat,
                              **{name: knobs[name] for name in given})


def run_generate(args: argparse.Namespace) -> int:
    """``bubbleless generate``: print the completion; exit status 2 with the reason on bad input."""
    try:
        settings = settings_from_args(args)
        model, tokenizer = load_for_generation(args.model, base=args.base, tokenizer_dir=args.tokenizer)
        text = generate_text(model, tokenizer, args.prompt, settings)
    except ValueError as error:
        print(f"bubbleless generate: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0
