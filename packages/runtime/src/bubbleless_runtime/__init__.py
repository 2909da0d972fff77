"""bubbleless_runtime: run any pipeline schedule for real: stage-bound ranks over torch.distributed
(``Pipeline``), or RoundPipe's round-robin pool of stateless devices in one process (``RoundRobinPipeline``).

    >>> from bubbleless_runtime import Pipeline, RoundRobinPipeline, spawn   # doctest: +SKIP
    >>> pipe = Pipeline(model, schedule="zbv", num_microbatches=8, loss_fn=loss_fn)  # doctest: +SKIP
    >>> pool = RoundRobinPipeline(model, devices=["cuda:0", "cuda:1"], num_microbatches=8,
    ...                           loss_fn=loss_fn, partition="auto", sample_input=x)  # doctest: +SKIP

Importing this package imports torch and the schedules package only (never transformers): the
Hugging Face adapters live in ``bubbleless_runtime.models`` and load on demand.
"""

from .comm import PipelineCommError
from .config import RunConfig, load_config
from .launch import init_from_env, run, spawn, under_torchrun
from .pipeline import DEFAULT_TIMEOUT, Pipeline
from .pool import RoundRobinPipeline
from .split_backward import defer_weight_grads, run_weight_grads
from .trainer import Trainer

__version__ = "0.1.0"
__all__ = [
    "DEFAULT_TIMEOUT", "Pipeline", "PipelineCommError", "RoundRobinPipeline", "RunConfig", "Trainer", "defer_weight_grads",
    "init_from_env", "load_config", "run", "run_weight_grads", "spawn", "under_torchrun",
]
