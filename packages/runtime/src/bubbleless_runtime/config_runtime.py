"""The checks on a config that need this machine, torch or the model, run by ``bubbleless train`` after
the config is validated and before any rank is spawned (so each is one message and exit status 2, never
a traceback per rank after spawning):

- ``train.output_dir`` can be created and written (else the report would be lost after training);
- a GPU is visible for ``train.device: cuda``, ``pipeline.backend: nccl`` or cuda ``pipeline.devices``;
- a dataset's tokenizer (``model.path``'s) has no token id beyond the model's embedding rows;
- with LoRA, every ``lora.target_modules`` name matches a linear layer of the model, and with
  ``pipeline.memory_cap`` the parameters alone can fit the cap. Both look at the model built on the
  ``meta`` device from its config (no weights allocated or read), and only when those fields are set.

``config_checks.validate`` holds every check that needs none of this (and imports no torch).
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from .config_checks import is_schedule_path, schedule_from_file, uses_pool

if TYPE_CHECKING:
    from .config_fields import RunConfig


def check_before_run(config: RunConfig, *, num_ranks: int) -> None:
    """Every check of this module, cheapest first."""
    check_output_dir(config.train.output_dir)
    check_device(config)
    if config.data.path is not None and config.model.path is not None:
        check_tokenizer_vocabulary(config.model.path)
    if config.lora.enabled or (config.pipeline.memory_cap is not None and not uses_pool(config.pipeline.schedule)):
        check_model(config, num_ranks=num_ranks)


def check_output_dir(path: str) -> None:
    """``train.output_dir``, or the nearest directory above it that exists (training creates the rest),
    must be a directory this process can write: a probe file is created there and removed. Nothing is
    left behind when the check fails or passes."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"train.output_dir {path!r} is a file; name a directory (it is created if missing)")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, "Not a directory")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        where = "" if existing == os.path.abspath(path) else f" ({existing!r} would hold it)"
        raise ValueError(
            f"train.output_dir {path!r} cannot be written{where}: {error.strerror or error}; the report, trace "
            f"and checkpoints go there: choose a directory you can write (or fix its permissions) before training"
        ) from None


def check_device(config: RunConfig) -> None:
    """``train.device: cuda``, ``pipeline.backend: nccl`` and cuda entries of ``pipeline.devices`` need a
    visible GPU: say so before anything starts, rather than from every rank's traceback."""
    if uses_pool(config.pipeline.schedule):
        _check_pool_devices(config.pipeline.devices)
        return
    if config.train.device != "cuda" and config.pipeline.backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        field = "train.device is 'cuda'" if config.train.device == "cuda" else "pipeline.backend is 'nccl'"
        raise ValueError(f"{field} but no GPU is visible here; set train.device: cpu and pipeline.backend: gloo")


def _check_pool_devices(devices: list[str]) -> None:
    if all(d == "cpu" for d in devices):
        return
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device in devices:
        index = int(device.partition(":")[2] or 0)
        if index >= visible:
            seen = "no GPU is visible here" if not visible else f"only {visible} GPUs are visible here"
            raise ValueError(
                f"pipeline.devices lists {device!r} but {seen}; use pipeline.devices: [cpu, cpu, ...] or the GPUs "
                f"cuda:0 .. cuda:{max(visible - 1, 0)}"
            )


def check_tokenizer_vocabulary(path: str) -> None:
    """Every id the tokenizer of ``model.path`` can produce has an embedding row (else an IndexError deep
    inside the first step)."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"model.path {path!r} has no tokenizer that loads ({error}); data.path is tokenized with "
                         f"it: save the tokenizer beside the model (tokenizer.save_pretrained)") from None
    vocab = AutoConfig.from_pretrained(path, local_files_only=True).vocab_size
    if len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer of model.path {path!r} has {len(tokenizer)} tokens but the model's vocab_size is {vocab}: "
            f"ids from {vocab} up have no embedding row; resize the model's embeddings to the tokenizer "
            f"(model.resize_token_embeddings(len(tokenizer))) and save both again"
        )


def meta_model(config: RunConfig):
    """The Hugging Face model of ``config.model`` on the meta device: shapes and names, no storage."""
    import torch

    from .models.hf import ARCHITECTURES, build_hf_config, torch_dtype

    m = config.model
    with torch.device("meta"):
        if m.path is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            hf_config = AutoConfig.from_pretrained(m.path, local_files_only=True)
            model = AutoModelForCausalLM.from_config(hf_config)
        else:
            import transformers

            entry = ARCHITECTURES[m.architecture]
            model = getattr(transformers, entry.model_class)(build_hf_config(m.architecture, **entry.fields(m)))
    return model.to(torch_dtype(m.dtype))


def check_model(config: RunConfig, *, num_ranks: int) -> None:
    """LoRA targets and the memory cap against the model built on the meta device."""
    model = meta_model(config)
    if config.lora.enabled:
        check_lora_targets(model, config.lora.target_modules)
    if config.pipeline.memory_cap is not None and not uses_pool(config.pipeline.schedule):
        check_memory_cap(config, model, num_ranks=num_ranks)


def check_lora_targets(model, targets: list[str]) -> None:
    """Each target must name a linear layer (peft matches a module whose name is, or ends in, it)."""
    import torch

    linear = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    short = sorted({name.rsplit(".", 1)[-1] for name in linear})
    unmatched = [t for t in targets if not any(n == t or n.endswith("." + t) for n in linear)]
    if unmatched:
        raise ValueError(
            f"lora.target_modules {unmatched} match no linear layer of the model; its linear layers are "
            f"named {short}: pick from those"
        )


def check_memory_cap(config: RunConfig, model, *, num_ranks: int) -> None:
    """No cut can fit a cap below what the parameters alone need: the largest layer, and the model's
    parameters spread evenly over the stages (ranks, for V schedules) that hold them."""
    from bubbleless_schedules import generate

    from .auto_partition import method_for
    from .models.layers import cut_causal_lm

    pipeline = config.pipeline
    if is_schedule_path(pipeline.schedule):
        schedule = schedule_from_file(pipeline.schedule)
    else:
        schedule = generate(pipeline.schedule, num_ranks=num_ranks, num_microbatches=pipeline.num_microbatches)
    per_rank = method_for(schedule) == "v"
    holders = num_ranks if per_rank else schedule.num_stages
    sizes = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in cut_causal_lm(model)]
    floor = max(max(sizes), -(-sum(sizes) // holders))
    if pipeline.memory_cap < floor:
        unit = "rank" if per_rank else "stage"
        raise ValueError(
            f"pipeline.memory_cap {pipeline.memory_cap:.4g} bytes cannot fit: the parameters alone need at least "
            f"{floor:,} bytes per {unit} (largest layer {max(sizes):,}, the model's {sum(sizes):,} over {holders} "
            f"{unit}s), before any activations; raise memory_cap above {floor:,} or run more ranks"
        )
