"""The round-robin example of ``bubbleless train --example roundrobin`` (a .py constant, so it ships in wheels).

RoundPipe's device pool on 4 CPU "devices" in one process: every weight, gradient and optimizer state
in host memory, stage jobs dealt to the devices in turn, each job's weights loaded and its gradients
stored around it. The same small Qwen3 and task as the embedded default (``default_config.py``), with
values that train visibly in about a minute on a 2-core CPU. ``partition: auto`` times the layers on
the first micro-batch and keeps the forward/backward group cut the simulator predicts fastest. On GPUs,
set ``pipeline.devices: [cuda:0, cuda:1, ...]``; nothing else changes.

The pool steps its host optimizer synchronously here. ``optimizer.asynchronous: true`` (RoundPipe's
default, one step stale) overlaps it with the next step, but on this small, fast-learning task it learns
markedly slower: the mean loss of the last 10 of the 200 steps was 1.000 against 0.051 synchronous
(2026-12-01, the 2-core build VM), and plain torch AdamW fed the same one-step-late gradients on the
unpipelined model follows the same curve (its mean over steps 181-200: 0.986 against 0.059), so it is the
staleness, not the pool. Turn it on where the optimizer step is a large part of the step time (large
models on GPUs).
"""

ROUNDROBIN_CONFIG_YAML = """\
model:
  architecture: qwen3
  vocab_size: 32
  hidden_size: 64
  intermediate_size: 128
  num_layers: 10
  num_heads: 4
  num_kv_heads: 2
  head_dim: 16
data:
  task: sort
  num_symbols: 16
  length: 12
  batch_size: 32
pipeline:
  schedule: roundrobin
  devices: [cpu, cpu, cpu, cpu]
  partition: auto
  num_microbatches: 8
optimizer:
  name: adamw
  lr: 3.0e-3
  warmup_steps: 10
  max_grad_norm: 1.0
train:
  steps: 200
  precision: fp32
  seed: 0
  output_dir: bubbleless-roundrobin
"""
