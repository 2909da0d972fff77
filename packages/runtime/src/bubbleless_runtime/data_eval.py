"""What ``bubbleless train`` trains on, and the validation loss every ``train.eval_every`` steps.

``training_data`` gives the synthetic task without ``data.path``, else the user's dataset
(``data_build``) and an ``Evaluation`` when there is a validation split.

Evaluation runs each validation batch through the same pipeline and schedule as training, on every
rank in lockstep, then throws the gradients away: the pipeline has no forward-only schedule yet, so an
evaluation costs about what a training step on the same tokens costs. The loss reported is the mean
over the validation batches of each batch's mean per-micro-batch loss (the report adds its perplexity).
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
        """The validation loss of the model as it is now (call on every rank); the gradients it made are dropped."""
        loss_fn, saved = trainer.loss, trainer.loss.factor
        loss_fn.factor = 1.0 / trainer.num_microbatches  # the mean over micro-batches, no loss scale
        total, count = 0.0, 0
        try:
            for inputs, targets in self.batches.in_order():
                ids = inputs[0]
                with trainer._autocast(trainer.autocast_device or ids.device.type):
                    loss = trainer.pipeline.step(inputs, targets)
                if loss is not None:
                    total += float(loss)
                count += 1
        finally:
            loss_fn.factor = saved
            trainer.optimizer.zero_grad(set_to_none=True)
        value = trainer._loss_everywhere(total / max(count, 1))
        self.history.append((trainer.step, value))
        return value


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
