"""Data parallelism across round-robin pools: one ``RoundRobinPipeline`` per process (a node's GPUs, or a
set of CPU devices), each on its own share of the global batch, their gradients averaged in host memory.

RoundPipe runs in one process on one node. Past one node, each replica here is a pool over its own
devices, built from the same initial weights. Once a step's last gradient has landed in the host's fp32
accumulators, the replicas all-reduce them over ``data_parallel_group`` and divide by the replica count,
as DDP averages, before anything reads them (the host optimizer, or ``.grad``). Every replica's optimizer
then takes the same step from the same state, so the weights stay identical without a broadcast.

Where it runs: ``step()`` averages after its devices are done, before the optimizer; ``steps()`` averages
step k while step k + 1 already computes on the devices (the caller's thread does it, between the end of
step k and its hand-off to the one-step-stale optimizer), so there the all-reduce overlaps compute. With
gradient accumulation (``optimizer_step=False``, or ``steps(accumulate=n)``) the sums are averaged once,
at the step the optimizer takes. The group must be a gloo group (or one with a gloo backend for CPU
tensors): the accumulators live in host memory.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .comm import wait_collective

__all__ = ["BUCKET_BYTES", "ReplicaAverager", "ReplicaShard"]

BUCKET_BYTES = 16 << 20
"""Small accumulators are all-reduced together in flat buckets up to this size (one collective each); a
tensor this large or larger is all-reduced in place, with no copy."""


def check_replica_group(group) -> None:
    """Refuse what cannot average host tensors, saying what to pass instead."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("data_parallel_group needs torch.distributed initialised in every replica: call "
                         "torch.distributed.init_process_group(backend='gloo') first (or launch with torchrun)")
    backend = str(dist.get_backend(group))
    if "gloo" not in backend:
        raise ValueError(f"data_parallel_group has backend {backend!r}, but the pool's gradients live in host "
                         "memory: pass a gloo group, e.g. torch.distributed.new_group(backend='gloo')")


def _buckets(tensors: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one dtype in runs of at most ``limit`` bytes; a tensor of ``limit`` or more alone."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if buckets and size + nbytes <= limit and buckets[-1][0].dtype == tensor.dtype:
            buckets[-1].append(tensor)
            size += nbytes
        else:
            buckets.append([tensor])
            size = nbytes
    return buckets


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


class ReplicaAverager:
    """Averages a pool's host gradient accumulators over ``group`` (``average``), in place."""

    def __init__(self, group, *, timeout: float) -> None:
        check_replica_group(group)
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.timeout = timeout

    def agree(self, shapes: list[tuple[int, ...]]) -> None:
        """Refuse replicas whose trainable parameters differ (``shapes``, in store order): their sums would be
        added position by position into each other's. One all-gather, at construction."""
        if self.size == 1:
            return
        mine = (len(shapes), sum(_numel(s) for s in shapes), hash(tuple(shapes)))
        found: list = [None] * self.size
        dist.all_gather_object(found, mine, group=self.group)
        differ = [r for r, theirs in enumerate(found) if theirs != found[0]]
        if differ:
            raise ValueError(
                f"data_parallel_group: replica(s) {differ} hold other trainable parameters than replica 0 "
                f"({found[differ[0]][0]} tensors, {found[differ[0]][1]:,} elements against {found[0][0]}, "
                f"{found[0][1]:,}, or other shapes): every replica must build the same model, with the same "
                "parameters trainable")

    def average(self, accumulators: list[torch.Tensor]) -> None:
        """Every replica's ``accumulators`` (the same tensors in the same order on each) set to their mean.
        The collectives are launched together and waited in order; a replica that died or stalled raises
        ``PipelineCommError`` within ``timeout`` (the sums are then partly averaged: drop them)."""
        if self.size == 1:
            return
        launched = []
        for bucket in _buckets([t for t in accumulators if t.numel()], BUCKET_BYTES):
            alone = len(bucket) == 1 and bucket[0].is_contiguous()
            flat = bucket[0] if alone else _flatten_dense_tensors(bucket)
            launched.append((dist.all_reduce(flat, group=self.group, async_op=True), flat, bucket))
        for work, flat, bucket in launched:
            wait_collective(work, self.timeout, "the replicas' gradient all-reduce", self.rank)
            flat.div_(self.size)
            if flat is not bucket[0]:
                for tensor, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                    tensor.copy_(reduced)

    def __repr__(self) -> str:
        return f"ReplicaAverager(replicas={self.size}, rank={self.rank})"


class ReplicaShard:
    """Replica ``replica`` of ``replicas``' batches of ``data`` (anything with ``batch(i)``): its i-th batch is
    ``data.batch(i * replicas + replica)``, so the replicas step on different batches, together each of
    them once, and a resumed run (same ``i`` everywhere) draws what the uninterrupted one would have."""

    def __init__(self, data, replica: int, replicas: int) -> None:
        if not 0 <= replica < replicas:
            raise ValueError(f"replica {replica} is not one of {replicas}")
        self.data, self.replica, self.replicas = data, replica, replicas

    def batch(self, index: int):
        return self.data.batch(index * self.replicas + self.replica)

    def __getattr__(self, name: str):  # the rest (sizes, summaries) as the data has them
        return getattr(self.data, name)
