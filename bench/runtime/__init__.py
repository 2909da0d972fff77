"""Runtime benchmarks: the backward split's cost, and step time against torch.distributed.pipelining."""
