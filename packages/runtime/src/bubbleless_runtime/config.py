"""The configuration of ``bubbleless train``: keyword-only dataclasses, one docstring per field.

``docs/config.md`` documents every field; ``load_config`` reads YAML, and a key that no dataclass
declares raises ``ValueError`` naming it (a typo must never fall back silently to a default).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field


@dataclass(kw_only=True)
class ModelConfig:
    """Which model to train: a Hugging Face architecture built from these sizes, or a local checkpoint."""

    architecture: str = "qwen3"
    """``qwen3``, ``llama`` or ``qwen3_moe``; built from the sizes below with freshly initialised weights."""
    path: str | None = None
    """A local directory written by ``save_pretrained``; when set, the model loads from it and the sizes
    below are ignored. Nothing is ever downloaded."""
    vocab_size: int = 32
    """Vocabulary size; must cover the data's tokens (``data.num_symbols + 3``)."""
    hidden_size: int = 64
    """Width of the hidden states."""
    intermediate_size: int = 128
    """Width of the dense MLP."""
    num_layers: int = 6
    """Decoder layers; the pipeline cuts ``num_layers + 2`` layers (embedding and norm + LM head added)."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention when fewer than ``num_heads``)."""
    head_dim: int = 16
    """Width of one attention head."""
    max_position_embeddings: int = 256
    """Longest sequence the rotary embedding is set up for."""
    tie_embeddings: bool = False
    """Share the embedding and LM-head weight; the trainer sums its gradient across the ranks holding it."""
    num_experts: int = 4
    """Experts per MoE layer (``qwen3_moe`` only)."""
    experts_per_token: int = 2
    """Experts each token is routed to (``qwen3_moe`` only)."""
    moe_intermediate_size: int = 64
    """Width of one expert's MLP (``qwen3_moe`` only)."""
    aux_loss_coef: float = 0.001
    """Weight of the router's load-balancing loss added to the LM loss (``qwen3_moe`` only)."""


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA fine-tuning through peft: when enabled only the adapters train."""

    enabled: bool = False
    """Inject LoRA adapters and freeze every base weight."""
    rank: int = 8
    """Rank of the adapter matrices."""
    alpha: float = 16.0
    """Scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get adapters."""


@dataclass(kw_only=True)
class DataConfig:
    """The synthetic task generated in code: each sample is ``BOS x SEP f(x)``; loss counts ``f(x)`` only."""

    task: str = "sort"
    """``copy``, ``reverse`` or ``sort``: the function ``f`` the model learns."""
    num_symbols: int = 16
    """Distinct symbols in ``x`` (token ids 3 .. num_symbols + 2; 0, 1, 2 are PAD, BOS, SEP)."""
    length: int = 12
    """Symbols in ``x``; a sample has ``2 * length + 2`` tokens."""
    batch_size: int = 32
    """Samples per pipeline step (split into ``pipeline.num_microbatches`` micro-batches)."""
    seed: int = 1234
    """Seed of the data stream; batch ``i`` depends only on (seed, i), so a resumed run sees the same data."""


@dataclass(kw_only=True)
class PipelineConfig:
    """How the model is cut and scheduled."""

    schedule: str = "zbv"
    """A schedule name from ``bubbleless_schedules.available()`` (gpipe, 1f1b, zb-h1, zbv, ...)."""
    nproc: int = 4
    """Pipeline ranks ``bubbleless train`` spawns locally (ignored under torchrun, which sets the world)."""
    num_microbatches: int = 8
    """Micro-batches per step; must divide ``data.batch_size``."""
    partition: str | list[int] = "even"
    """``even`` (equal layer counts), ``auto`` or a list of layers per stage (summing to
    ``model.num_layers + 2``). ``auto``: rank 0 times every layer on the first step's first micro-batch,
    and every rank cuts that one profile the same way: V schedules (zbv, ...) balance each rank's two
    chunks, the others the stages (``bubbleless_partition.cut`` methods ``v`` and ``dp``). The report then
    shows the simulator's predicted step time and bubble rate with the even cut and the auto cut."""
    memory_cap: float | None = None
    """With ``partition: auto``: bytes a stage (a rank, for V schedules) may hold, counted as parameter
    bytes plus one micro-batch's saved activations; no cut that fits raises an error naming the smallest
    cap that would."""
    backend: str = "gloo"
    """torch.distributed backend: ``gloo`` on CPU, ``nccl`` on GPUs."""


@dataclass(kw_only=True)
class OptimizerConfig:
    """Optimizer and learning-rate schedule (linear warmup, then cosine decay)."""

    name: str = "adamw"
    """``adamw``, ``adam`` or ``sgd``."""
    lr: float = 3e-3
    """Peak learning rate."""
    weight_decay: float = 0.01
    """Decoupled weight decay, applied to matrices only (not to norms and biases)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """Adam moment coefficients."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    momentum: float = 0.9
    """SGD momentum (``sgd`` only)."""
    warmup_steps: int = 10
    """Steps of linear warmup from 0 to ``lr``."""
    min_lr_ratio: float = 0.1
    """Learning rate at the end of the cosine decay, as a fraction of ``lr``."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm (over all ranks) to this; 0 disables clipping."""


@dataclass(kw_only=True)
class TrainConfig:
    """The training loop."""

    steps: int = 200
    """Optimizer steps to run."""
    grad_accum: int = 1
    """Pipeline steps whose gradients add up before one optimizer step."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast with a dynamic loss scaler)."""
    seed: int = 0
    """Seed for weight initialisation and every random number generator."""
    device: str = "cpu"
    """``cpu`` or ``cuda`` (rank r uses cuda:r modulo the local GPU count)."""
    log_every: int = 10
    """Refresh the progress bar's loss and tokens/s every this many steps."""
    output_dir: str = "bubbleless-run"
    """Where the timeline PNG, the Chrome trace, checkpoints and the LoRA adapter go."""
    save_every: int = 0
    """Write a checkpoint every this many steps (0: only at the end when ``checkpoint`` is true)."""
    checkpoint: bool = False
    """Write a checkpoint at the end of the run."""
    resume: str | None = None
    """A checkpoint directory to resume from (model, optimizer, scheduler, RNG, step, data position)."""


@dataclass(kw_only=True)
class RunConfig:
    """Everything ``bubbleless train`` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters."""
    data: DataConfig = field(default_factory=DataConfig)
    """The synthetic task."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Cutting and scheduling."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and learning-rate schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""


CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("model", "architecture"): ("qwen3", "llama", "qwen3_moe"),
    ("data", "task"): ("copy", "reverse", "sort"),
    ("optimizer", "name"): ("adamw", "adam", "sgd"),
    ("train", "precision"): ("fp32", "bf16", "fp16"),
    ("train", "device"): ("cpu", "cuda"),
    ("pipeline", "backend"): ("gloo", "nccl"),
}


def validate(config: RunConfig) -> RunConfig:
    """Raise ValueError for values that cannot work together, naming the field to change."""
    for (section, name), allowed in CHOICES.items():
        value = getattr(getattr(config, section), name)
        if value not in allowed:
            raise ValueError(f"{section}.{name} is {value!r}; choose one of {list(allowed)}")
    positive = [
        ("data", "batch_size"), ("data", "length"), ("data", "num_symbols"), ("pipeline", "nproc"),
        ("pipeline", "num_microbatches"), ("train", "steps"), ("train", "grad_accum"), ("model", "num_layers"),
    ]  # fmt: skip
    for section, name in positive:
        if getattr(getattr(config, section), name) < 1:
            raise ValueError(f"{section}.{name} must be at least 1")
    _validate_partition(config.pipeline)
    if config.data.batch_size % config.pipeline.num_microbatches:
        raise ValueError(
            f"data.batch_size {config.data.batch_size} is not divisible by pipeline.num_microbatches "
            f"{config.pipeline.num_microbatches}; make the batch a multiple of the micro-batch count"
        )
    if config.model.path is None and config.model.vocab_size < config.data.num_symbols + 3:
        raise ValueError(
            f"model.vocab_size {config.model.vocab_size} is too small for data.num_symbols "
            f"{config.data.num_symbols}; make it at least {config.data.num_symbols + 3}"
        )
    return config


def _validate_partition(pipeline: PipelineConfig) -> None:
    if isinstance(pipeline.partition, str) and pipeline.partition not in ("even", "auto"):
        raise ValueError(
            f"pipeline.partition is {pipeline.partition!r}; use even, auto or a list of layers per stage"
        )
    if pipeline.memory_cap is not None and pipeline.partition != "auto":
        raise ValueError("pipeline.memory_cap applies to pipeline.partition: auto only; set both or drop memory_cap")
    if pipeline.memory_cap is not None and not pipeline.memory_cap > 0:
        raise ValueError(f"pipeline.memory_cap must be a positive number of bytes, got {pipeline.memory_cap!r}")


def config_from_dict(data: dict | None, cls: type = RunConfig, *, prefix: str = ""):
    """Build ``cls`` from nested dicts; unknown keys and wrong types raise ValueError naming the key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config section {prefix.rstrip('.') or '<top>'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"unknown config key {prefix + str(unknown[0])!r}; "
            f"known keys{' under ' + prefix.rstrip('.') if prefix else ''}: {sorted(known)}"
        )
    values = {}
    for name, raw in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = config_from_dict(raw, kind, prefix=f"{prefix}{name}.")
        else:
            values[name] = _coerce(raw, kind, f"{prefix}{name}")
    return cls(**values)


def _coerce(value, kind, key: str):
    """Accept YAML's spellings (``3e-3`` is a string to PyYAML) while rejecting the wrong type."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options[:-1]:  # the first type that takes the value; the last one's error is reported
            try:
                return _coerce(value, option, key)
            except ValueError:
                pass
        kind = options[-1]
        args = typing.get_args(kind)
    origin = typing.get_origin(kind)
    try:
        if origin is list:
            if not isinstance(value, list):
                raise TypeError
            return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
        if kind is bool:
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int:
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise TypeError
            return int(float(value))
        if kind is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind is str:
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError):
        pass
    else:
        raise AssertionError(f"unhandled config type {kind} for {key}")
    raise ValueError(f"config key {key!r} expects {getattr(kind, '__name__', kind)}, got {value!r}")


def load_config(path: str | os.PathLike | None = None, *, text: str | None = None) -> RunConfig:
    """Read a YAML file (or ``text``) into a validated ``RunConfig``; missing keys keep their defaults."""
    import yaml

    if text is None:
        if path is None:
            return validate(RunConfig())
        if not os.path.isfile(path):
            raise ValueError(f"config file {str(path)!r} does not exist")
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    return validate(config_from_dict(yaml.safe_load(text)))


def config_to_dict(config) -> dict:
    """The config as plain nested dicts (for logging and for writing a YAML beside the results)."""
    return dataclasses.asdict(config)


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """Per config class: (field, type, default, docstring), read from this file's source.

    Field docstrings are not kept at runtime, so they are read with ``ast``; ``docs/config.md`` is
    generated from this, and a test keeps the page and the code in step.
    """
    import ast
    import inspect
    import sys

    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    classes = {c.__name__: c for c in (RunConfig, *SECTIONS.values())}
    docs: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in classes:
            continue
        defaults = {f.name: f for f in dataclasses.fields(classes[node.name])}
        rows = []
        for item, following in zip(node.body, node.body[1:] + [None], strict=True):
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                doc = ""
                if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                    doc = " ".join(str(following.value.value).split())
                name = item.target.id
                rows.append((name, ast.unparse(item.annotation), _default_text(defaults[name]), doc))
        docs[node.name] = rows
    return docs


def _default_text(f: dataclasses.Field) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(section)" if dataclasses.is_dataclass(value) else repr(value)
    return repr(f.default)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "lora": LoraConfig,
    "data": DataConfig,
    "pipeline": PipelineConfig,
    "optimizer": OptimizerConfig,
    "train": TrainConfig,
}


def config_reference_markdown() -> str:
    """The text of ``docs/config.md`` (regenerate: ``python -m bubbleless_runtime.config > docs/config.md``)."""
    docs = field_docs()
    lines = [
        "# `bubbleless train` configuration reference",
        "",
        "<!-- generated from bubbleless_runtime/config.py by "
        "`python -m bubbleless_runtime.config > packages/runtime/docs/config.md`; edit the docstrings there -->",
        "",
        "A YAML file with up to six sections; every key is optional and takes the default shown. A key that",
        "is not listed here is an error that names it. `bubbleless train` with no file runs the embedded",
        "default (`bubbleless train --print-config` prints it). `--nproc`, `--steps`, `--schedule`,",
        "`--output-dir` and `--resume` override the matching fields.",
        "",
        "```yaml",
        "model: {architecture: qwen3, num_layers: 6}",
        "pipeline: {schedule: zbv, nproc: 4, num_microbatches: 8}",
        "train: {steps: 300, precision: bf16}",
        "```",
    ]
    for section, cls in SECTIONS.items():
        lines += ["", f"## `{section}`", "", " ".join((cls.__doc__ or "").split()), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for name, kind, default, doc in docs[cls.__name__]:
            kind, doc = kind.replace("|", "\\|"), doc.replace("``", "`").replace("|", "\\|")
            lines.append(f"| `{section}.{name}` | `{kind}` | `{default}` | {doc} |")
        for (s, n), values in CHOICES.items():
            if s == section:
                lines.append(f"\n`{section}.{n}` accepts: {', '.join(f'`{v}`' for v in values)}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(config_reference_markdown(), end="")
