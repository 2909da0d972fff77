"""The embedded default of ``bubbleless train`` (a .py constant, so it ships without package-data).

Every field is documented in ``docs/config.md``; this file only picks values that train visibly in
one to two minutes on a 2-core CPU with 4 ranks. ``partition: auto`` because with V placement rank 0
holds both the embedding and the head: the profiled cut gives it decoder layers to balance them.
"""

DEFAULT_CONFIG_YAML = """\
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
  schedule: zbv
  nproc: 4
  partition: auto
  num_microbatches: 8
optimizer:
  name: adamw
  lr: 3.0e-3
  warmup_steps: 10
  max_grad_norm: 1.0
train:
  steps: 300
  precision: fp32
  seed: 0
  output_dir: bubbleless-run
"""
