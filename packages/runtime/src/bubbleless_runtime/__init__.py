"""bubbleless_runtime: run any pipeline schedule for real: stage-bound ranks over torch.distributed
(``Pipeline``), or RoundPipe's round-robin pool of stateless devices in one process (``RoundRobinPipeline``).

    >>> from bubbleless_runtime import Pipeline, RoundRobinPipeline, spawn   # doctest: +SKIP
    >>> pipe = Pipeline(model, schedule="zbv", num_microbatches=8, loss_fn=loss_fn)  # doctest: +SKIP
    >>> pool = RoundRobinPipeline(model, devices=["cuda:0", "cuda:1"], num_microbatches=8,
    ...                           loss_fn=loss_fn, partition="auto", sample_input=x)  # doctest: +SKIP

Importing this package imports nothing else: each name below loads its module (and torch, for all but
the config) on first use, so that validating a config (``bubbleless_runtime.config.load_config``) needs no
torch. The Hugging Face adapters live in ``bubbleless_runtime.models`` and load on demand too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .comm import PipelineCommError
    from .config import RunConfig, load_config
    from .launch import init_from_env, run, spawn, under_torchrun
    from .pipeline import DEFAULT_TIMEOUT, Pipeline
    from .pool import RoundRobinPipeline
    from .split_backward import defer_weight_grads, run_weight_grads
    from .trainer import Trainer

_HOME = {
    "PipelineCommError": "comm", "RunConfig": "config", "load_config": "config", "init_from_env": "launch",
    "run": "launch", "spawn": "launch", "under_torchrun": "launch", "DEFAULT_TIMEOUT": "pipeline",
    "Pipeline": "pipeline", "RoundRobinPipeline": "pool", "defer_weight_grads": "split_backward",
    "run_weight_grads": "split_backward", "Trainer": "trainer",
}  # fmt: skip
"""Public name -> the submodule that defines it (PEP 562 lazy attributes)."""


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'bubbleless_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"
__all__ = [
    "DEFAULT_TIMEOUT", "Pipeline", "PipelineCommError", "RoundRobinPipeline", "RunConfig", "Trainer", "defer_weight_grads",
    "init_from_env", "load_config", "run", "run_weight_grads", "spawn", "under_torchrun",
]
