"""Ranges of the numeric config fields, and the model's shape against the data: each bad value is a
``ValueError`` naming the key and the value that would work, raised when the config is loaded (before
any process starts) instead of as a ZeroDivisionError, an IndexError or a stuck loss in the middle of
training. ``model.path`` is read here too, but only its ``config.json`` (vocabulary, positions): no
torch. Called from ``config_checks.validate``.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config_fields import RunConfig

MODEL_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
               "max_position_embeddings")
MOE_SIZES = ("num_experts", "experts_per_token", "moe_intermediate_size")
DERIVED_HEAD_WIDTH = ("llama", "qwen2")
"""Architectures whose head width is ``hidden_size / num_heads`` (``model.head_dim`` unused)."""


def check_ranges(config: RunConfig) -> None:
    """Every range below, in the order a reader of the YAML meets the sections."""
    check_model(config)
    check_lora(config)
    check_optimizer(config)
    check_train(config)
    check_sequence_and_vocabulary(config)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_model(config: RunConfig) -> None:
    m = config.model
    if m.path is not None:
        _model_path_config(m.path)  # exists, and has a config.json
        return
    for name in MODEL_SIZES + (MOE_SIZES if m.architecture == "qwen3_moe" else ()):
        value = getattr(m, name)
        if value < 1:
            raise ValueError(f"model.{name} must be at least 1, got {value}")
    if m.num_heads % m.num_kv_heads:
        raise ValueError(
            f"model.num_kv_heads {m.num_kv_heads} does not divide model.num_heads {m.num_heads}: each key/value "
            f"head serves a whole group of query heads; pick a divisor of {m.num_heads}, e.g. "
            f"{_divisors(m.num_heads)}"
        )
    if m.architecture in DERIVED_HEAD_WIDTH and m.hidden_size % m.num_heads:
        raise ValueError(
            f"model.num_heads {m.num_heads} does not divide model.hidden_size {m.hidden_size} ({m.architecture} "
            f"derives the head width as hidden_size / num_heads); pick num_heads from {_divisors(m.hidden_size)}"
        )
    if m.architecture == "qwen3_moe" and m.experts_per_token > m.num_experts:
        raise ValueError(
            f"model.experts_per_token {m.experts_per_token} is more than model.num_experts {m.num_experts}; "
            f"route each token to at most {m.num_experts} experts"
        )
    if not _finite(m.aux_loss_coef) or m.aux_loss_coef < 0:
        raise ValueError(f"model.aux_loss_coef must be a finite number >= 0, got {m.aux_loss_coef!r}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:8]


def _model_path_config(path: str) -> dict:
    """``config.json`` of a local model directory; ValueError saying what is missing."""
    if not os.path.exists(path):
        raise ValueError(
            f"model.path {path!r} does not exist; point it at a local Hugging Face model directory (one that "
            f"save_pretrained wrote; `bubbleless fetch-example-model DIR` writes one), or drop model.path to "
            f"build the model from the model.* sizes"
        )
    if not os.path.isdir(path):
        raise ValueError(f"model.path {path!r} is a file; point it at the directory that holds config.json")
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise ValueError(
            f"model.path {path!r} has no config.json, so it is not a Hugging Face model directory; point it at "
            f"the directory save_pretrained wrote"
        )
    try:
        with open(file, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise ValueError(f"model.path {path!r}: config.json cannot be read as JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model.path {path!r}: config.json holds {type(data).__name__}, not a JSON object")
    return data


def check_lora(config: RunConfig) -> None:
    lora = config.lora
    if not lora.enabled:
        return
    if lora.rank < 1:
        raise ValueError(f"lora.rank must be at least 1, got {lora.rank} (turn LoRA off with lora.enabled: false)")
    if not _finite(lora.alpha) or lora.alpha <= 0:
        raise ValueError(f"lora.alpha must be a finite number > 0, got {lora.alpha!r} (the update is alpha / rank)")
    if not _finite(lora.dropout) or not 0 <= lora.dropout < 1:
        raise ValueError(f"lora.dropout is a probability in [0, 1), got {lora.dropout!r}")
    if not lora.target_modules:
        raise ValueError("lora.target_modules is empty; name the linear layers to adapt, e.g. [q_proj, v_proj]")


def check_optimizer(config: RunConfig) -> None:
    o = config.optimizer
    if not _finite(o.lr) or o.lr <= 0:
        raise ValueError(f"optimizer.lr must be a finite number > 0, got {o.lr!r} (e.g. 3.0e-3)")
    if len(o.betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in o.betas):
        raise ValueError(
            f"optimizer.betas must be two numbers in [0, 1) (Adam's first and second moment), got {o.betas!r}; "
            f"e.g. [0.9, 0.95]"
        )
    if not _finite(o.eps) or o.eps <= 0:
        raise ValueError(f"optimizer.eps must be a finite number > 0, got {o.eps!r} (e.g. 1.0e-8)")
    if not _finite(o.weight_decay) or o.weight_decay < 0:
        raise ValueError(f"optimizer.weight_decay must be a finite number >= 0, got {o.weight_decay!r}")
    if not _finite(o.momentum) or not 0 <= o.momentum < 1:
        raise ValueError(f"optimizer.momentum must be in [0, 1), got {o.momentum!r}")
    if o.warmup_steps < 0:
        raise ValueError(f"optimizer.warmup_steps must be 0 (no warmup) or more, got {o.warmup_steps}")
    if not _finite(o.min_lr_ratio) or not 0 <= o.min_lr_ratio <= 1:
        raise ValueError(f"optimizer.min_lr_ratio is a fraction of optimizer.lr in [0, 1], got {o.min_lr_ratio!r}")
    if o.max_grad_norm is not None and (not _finite(o.max_grad_norm) or o.max_grad_norm < 0):
        raise ValueError(
            f"optimizer.max_grad_norm must be a finite number > 0 (or 0 / null: no clipping), got {o.max_grad_norm!r}"
        )


def check_train(config: RunConfig) -> None:
    t = config.train
    if t.log_every < 1:
        raise ValueError(f"train.log_every must be at least 1 (steps between progress updates), got {t.log_every}")
    if t.save_every is not None and t.save_every < 0:
        raise ValueError(
            f"train.save_every must be a positive step count, or 0 / null for a checkpoint at the end only, "
            f"got {t.save_every}"
        )
    if not t.output_dir:
        raise ValueError("train.output_dir is empty; name a directory for the report, trace and checkpoints")


def length_of(data) -> int:
    """Tokens of one synthetic sample: ``BOS x SEP f(x)``."""
    return 2 * data.length + 2


def check_sequence_and_vocabulary(config: RunConfig) -> None:
    """The longest sequence fits the rotary table, and every token id has an embedding row."""
    m, d = config.model, config.data
    if getattr(d, "path", None) is not None and m.path is None:
        return  # data_files.check_data_config refuses it: a dataset needs model.path's tokenizer
    if m.path is not None:
        hf = _model_path_config(m.path)
        vocab, positions, where = hf.get("vocab_size"), hf.get("max_position_embeddings"), f"{m.path}/config.json"
    else:
        vocab, positions, where = m.vocab_size, m.max_position_embeddings, "model"
    if getattr(d, "path", None) is not None:  # a user's dataset: its rows are data.seq_len tokens at most
        length, what = d.seq_len, f"data.seq_len {d.seq_len} is"
    else:
        length, what = length_of(d), f"the synthetic samples (2 * data.length + 2 = {length_of(d)} tokens) are"
        needed = d.num_symbols + 3
        if isinstance(vocab, int) and vocab < needed and m.path is not None:
            raise ValueError(
                f"data.num_symbols {d.num_symbols} needs token ids up to {needed - 1} but the model at model.path "
                f"has vocab_size {vocab} ({where}); lower data.num_symbols to at most {vocab - 3}"
            )
    if isinstance(positions, int) and length > positions:
        key = "model.max_position_embeddings" if m.path is None else f"max_position_embeddings in {where}"
        fix = "raise model.max_position_embeddings" if m.path is None else "use shorter sequences"
        raise ValueError(
            f"{what} longer than {key} {positions}; {fix}, or lower "
            f"{'data.seq_len' if getattr(d, 'path', None) is not None else 'data.length'}"
        )
