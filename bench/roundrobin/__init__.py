"""Round-robin pool benchmarks: one CPU device against plain training, two against one, the simulator
against the measured step."""
