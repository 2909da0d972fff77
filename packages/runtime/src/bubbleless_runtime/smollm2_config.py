"""``bubbleless train --example smollm2-lora``: LoRA fine-tuning of SmolLM2-135M-Instruct on the shipped
instruction chats (``examples/instructions.jsonl``), 4 CPU ranks, packed rows, a validation split.

The model is the directory ``bubbleless fetch-example-model smollm2-135m`` writes (relative to the
working directory; ``model.path`` in a config of your own can point anywhere). Values picked to show the
training and eval loss dropping within a few minutes on CPU.
"""

from __future__ import annotations

EXAMPLE_MODEL_DIR = "smollm2-135m"
"""Where the example expects the model (``bubbleless fetch-example-model smollm2-135m``)."""


def smollm2_lora_yaml() -> str:
    """The example's config, the shipped data's path where this package is installed."""
    import os

    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "examples", "instructions.jsonl")
    return f"""\
model:
  path: {EXAMPLE_MODEL_DIR}
  dtype: fp32
lora:
  enabled: true
  rank: 8
  alpha: 16
data:
  path: {data}
  packing: true
  seq_len: 128
  batch_size: 8
  validation_fraction: 0.1
pipeline:
  schedule: zbv
  nproc: 4
  num_microbatches: 4
optimizer:
  name: adamw
  lr: 2.0e-3
  warmup_steps: 3
train:
  steps: 24
  eval_every: 8
  log_every: 1
  seed: 0
  output_dir: bubbleless-smollm2-lora
"""
