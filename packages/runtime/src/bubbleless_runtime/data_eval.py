"""What ``bubbleless train`` trains on, and the validation loss every ``train.eval_every`` steps.

``training_data`` gives the synthetic task without ``data.path``, else the user's dataset
(``data_build``) and an ``Evaluation`` when there is a validation split.

Evaluation runs each validation batch on every rank in lockstep. On a stage-bound ``Pipeline`` it runs
the forward half of the pipeline's own lowered schedule (its F, send-F and receive-F actions in their
order, so the ranks meet as in training) under ``torch.no_grad``, on an executor of its own that shares
the pipeline's stage modules and channel: no backward and no saved activations. The round-robin pool
has no such half yet, so there a validation batch is a training step of the pool whose gradients are
thrown away (about three times the forward's cost); an update of the one-step-stale host optimizer
still in flight is applied first (``Trainer.synchronize``), so the loss is the model's after every step. The loss reported is the mean over the validation
batches of each batch's mean per-micro-batch loss (the report adds its perplexity).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Evaluation:
    """The validation batches and the losses measured on them."""

    batches: object
    """A ``TokenBatches`` of the validation rows (visited in order, every full batch)."""
    every: int
    """Evaluate when the step is a multiple of this (0: at the end only); always after the last step."""
    history: list[tuple[int, float]] = field(default_factory=list)
    """(step, validation loss) of every evaluation so far."""

    def due(self, step: int, total_steps: int) -> bool:
        return step == total_steps or (self.every > 0 and step % self.every == 0)

    def run(self, trainer) -> float:
        """The validation loss of the model as it is now (call on every rank); no weight or gradient changes."""
        loss_fn, saved = trainer.loss, trainer.loss.factor
        loss_fn.factor = 1.0 / trainer.num_microbatches  # the mean over micro-batches, no loss scale
        forward = ForwardOnly.of(trainer.pipeline)
        trainer.synchronize()
        total, count = 0.0, 0
        try:
            for inputs, targets in self.batches.in_order():
                ids = inputs[0]
                with trainer._autocast(trainer.autocast_device or ids.device.type):
                    if forward is None:
                        loss = trainer.pipeline_step(inputs, targets, update=False)
                    else:
                        loss = forward.step(inputs, targets)
                if loss is not None:
                    total += float(loss)
                count += 1
        finally:
            loss_fn.factor = saved
            if forward is None:  # the pool's training steps left gradients
                trainer.discard_gradients()
        value = trainer._loss_everywhere(total / max(count, 1))
        self.history.append((trainer.step, value))
        return value


FORWARD_KINDS = ("F", "SEND_F", "RECV_F")
"""The action kinds of a schedule's forward half (``Kind`` member names)."""


class ForwardOnly:
    """The forward half of a stage-bound ``Pipeline``'s schedule, run without autograd.

    Dropping every backward action from each rank's list keeps the forwards and their transfers in their
    order: every receive still has its send, and no forward ever waited on a backward, so the ranks meet
    as in training. It runs on its own executor (its own shape caches) over the pipeline's stage modules
    and channel; message tags are the training step's, which is safe because steps never overlap."""

    def __init__(self, pipeline) -> None:
        import dataclasses

        from bubbleless_schedules import Kind

        from .executor import Executor

        keep = {Kind[name] for name in FORWARD_KINDS}
        lowered = pipeline.lowered
        actions = tuple(tuple(a for a in worker if a.kind in keep) for worker in lowered.actions)
        self.pipeline = pipeline
        trained = pipeline._executor
        self.executor = Executor(
            rank=pipeline.rank, lowered=dataclasses.replace(lowered, actions=actions),
            modules=dict(zip(pipeline.stages, pipeline.modules, strict=True)), loss_fn=pipeline.loss_fn,
            channel=trained.channel, on_stage_done=lambda stage: None, prefetch=trained.prefetch,
            interpreter=trained.interpreter,
        )

    @classmethod
    def of(cls, pipeline):
        """The pipeline's forward half (made once, kept on it), or None for a pipeline without one."""
        if not all(hasattr(pipeline, name) for name in ("lowered", "_executor", "stages", "modules")):
            return None
        found = getattr(pipeline, "_forward_only", None)
        if found is None:
            found = cls(pipeline)
            pipeline._forward_only = found
        return found

    def step(self, inputs, targets):
        """The summed loss of one batch on the rank holding the last stage, else None."""
        import torch

        from .batches import check_batch, signature_of, split_batch
        from .executor import StepState

        pipe = self.pipeline
        check_batch(inputs, targets, pipe.num_microbatches)
        micro_inputs = split_batch(inputs, pipe.num_microbatches, pipe.device)
        micro_targets = split_batch(targets, pipe.num_microbatches, pipe.device)
        state = StepState(micro_inputs, micro_targets, signature_of(micro_inputs[0]), device=pipe.device)
        with torch.no_grad():
            self.executor.run(state)
        if self.executor.channel is not None:
            self.executor.channel.wait_sends()
        if not pipe.holds_loss:
            return None
        return torch.stack([state.losses[m] for m in range(pipe.num_microbatches)]).sum()


def training_data(config, *, rank: int = 0):
    """(the data with ``batch(i)``, an ``Evaluation`` or None, a summary to print or None)."""
    d = config.data
    if d.path is None:
        from .data import SyntheticTask

        task = SyntheticTask(task=d.task, num_symbols=d.num_symbols, length=d.length, batch_size=d.batch_size,
                             seed=d.seed)
        return task, None, None
    from .data_build import build_data, load_tokenizer

    tokenizer = load_tokenizer(config.model.path)
    split = build_data(config, tokenizer, rank=rank)
    evaluation = None
    if split.validation is not None:
        evaluation = Evaluation(split.validation, config.train.eval_every)
    return split.train, evaluation, split.summary


def sample_input_of(data, num_microbatches: int):
    """The first micro-batch of the first batch's inputs (what ``partition: auto`` profiles)."""
    inputs = data.batch(0)[0]
    if isinstance(inputs, tuple):
        return tuple(t.chunk(num_microbatches)[0] for t in inputs)
    return inputs.chunk(num_microbatches)[0]
