"""Point-to-point transfers between pipeline ranks that cannot hang.

- Every transfer carries a tag unique within a step (kind, stage, micro-batch, tensor index), so on
  gloo a receive can only ever match its own send. NCCL/RCCL ignore tags and match in posting order,
  which the lowered schedule fixes identically on both sides.
- Consecutive transfers go out as one ``batch_isend_irecv`` (one grouped launch on NCCL/RCCL). Gloo does
  not coalesce, and there each transfer is posted directly: the same operations, without the coalescing
  manager's ~15 us per call. Receives are waited just before the action that consumes them; a send is
  released once it has completed (checked whenever the next transfers are posted), and the rest are
  waited at the end of the step, so a sent tensor does not outlive its delivery by a whole step.
- On gloo each direction between two ranks has its own process group (``direction_groups``): transfers
  from a lower to a higher group rank use the pipeline group, the opposite direction a twin of it. When
  two ranks send to each other at the same moment over one gloo pair, a send or receive stalls for
  2-6 ms in 5-20% of such crossings; V-shaped schedules cross in nearly every step. With a pair per
  direction the stalls go (``bench/runtime/gloo_crossing_sends.py``, recorded in bench/results/runtime.md).
- Every wait has a deadline (``timeout`` seconds). A dead peer or ranks running different schedules turn
  into ``PipelineCommError`` on every surviving rank, naming the transfer, the peer and what to check,
  instead of a silent hang.
- Shapes are exchanged once per input signature: the first forward transfer of a stage boundary is
  preceded by a small fixed-size metadata message; afterwards receivers allocate from the cache.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

META_LEN = 128
MAX_TENSORS = 16
_DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64,
]
_KIND_CODE = {"F": 0, "B": 1, "META": 2}


class PipelineCommError(RuntimeError):
    """A transfer did not complete: a rank died, timed out, or runs a different schedule."""


def tag_of(kind: str, stage: int, microbatch: int, index: int, num_stages: int, num_microbatches: int) -> int:
    """A tag unique per message within a step (kind F/B/META, stage, micro-batch, tensor index)."""
    return ((_KIND_CODE[kind] * num_stages + stage) * num_microbatches + microbatch) * MAX_TENSORS + index


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


def as_tuple(activation) -> tuple[torch.Tensor, ...]:
    """An activation (Tensor or tuple of Tensors) as a tuple; ``ValueError`` for anything else."""
    items = activation if isinstance(activation, (tuple, list)) else (activation,)
    if not items or not all(isinstance(t, torch.Tensor) for t in items) or len(items) > MAX_TENSORS:
        raise ValueError(
            f"a stage must return a Tensor or a tuple of 1..{MAX_TENSORS} Tensors to pass to the next stage, "
            f"got {type(activation).__name__}"
        )
    return tuple(items)


def encode_meta(tensors: tuple[torch.Tensor, ...], is_tuple: bool) -> torch.Tensor:
    values = [len(tensors), int(is_tuple)]
    for t in tensors:
        values += [_DTYPES.index(t.dtype), t.dim(), *t.shape]
    if len(values) > META_LEN:
        raise ValueError(f"activation metadata too large ({len(values)} > {META_LEN} values): fewer or flatter tensors")
    return torch.tensor(values + [0] * (META_LEN - len(values)), dtype=torch.int64)


def decode_meta(buffer: torch.Tensor) -> tuple[tuple[TensorMeta, ...], bool]:
    values = buffer.tolist()
    count, is_tuple, pos, metas = values[0], bool(values[1]), 2, []
    for _ in range(count):
        dtype, ndim = _DTYPES[values[pos]], values[pos + 1]
        metas.append(TensorMeta(tuple(values[pos + 2:pos + 2 + ndim]), dtype))
        pos += 2 + ndim
    return tuple(metas), is_tuple


@dataclass
class Transfer:
    """One message: send ``tensor`` to, or receive it from, ``peer`` (a rank of the pipeline group)."""

    is_send: bool
    peer: int
    tensor: torch.Tensor
    tag: int
    label: str
    work: object = None


_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # pipeline group -> its twin


def direction_groups(group, timeout: float) -> tuple[object, object]:
    """(group for transfers to a higher group rank, group for transfers to a lower one).

    Gloo: the pipeline group and a twin with the same ranks, created once per group (only its members
    take part, so every rank of ``group`` must call this, as ``Pipeline`` does when it is built). The
    cache holds the pipeline group weakly, so the twin lives as long as the group (and the pipelines
    that use it), not until interpreter exit. Other backends: the pipeline group both ways (NCCL/RCCL
    keep one stream per peer pair and match in order)."""
    if dist.get_backend(group) != "gloo":
        return group, group
    key = group if group is not None else dist.group.WORLD
    if key not in _TWINS:
        ranks = dist.get_process_group_ranks(key)
        _TWINS[key] = dist.new_group(
            ranks, timeout=timedelta(seconds=timeout), use_local_synchronization=True,
        )
    return group, _TWINS[key]


@dataclass
class Channel:
    """Posts and waits transfers on ``group`` with a deadline per wait; transfers towards a lower group
    rank go over ``downward`` (default: ``group`` too, see ``direction_groups``)."""

    group: object
    timeout: float
    rank: int
    sends: list[Transfer] = field(default_factory=list)
    coalesces: bool | None = None  # None: ask the backend on the first post (gloo does not coalesce)
    downward: object = None
    global_ranks: list[int] = field(init=False)  # group rank -> global rank

    def __post_init__(self) -> None:
        # torch before 2.6 addresses p2p by global rank only; the twin group has the same ranks as
        # ``group``, so one mapping, looked up once here rather than per transfer, serves both directions
        size = dist.get_world_size(self.group)
        self.global_ranks = (list(range(size)) if self.group is None
                             else [dist.get_global_rank(self.group, r) for r in range(size)])

    def group_of(self, t: Transfer):
        """The group a transfer travels on: sender and receiver compute the same one."""
        source, destination = (self.rank, t.peer) if t.is_send else (t.peer, self.rank)
        return self.downward if self.downward is not None and destination < source else self.group

    def post(self, transfers: list[Transfer]) -> None:
        """Issue consecutive transfers together (one ``batch_isend_irecv`` where the backend coalesces)."""
        if not transfers:
            return
        self.release_finished_sends()
        if self.coalesces is None:
            self.coalesces = dist.get_backend(self.group) != "gloo"
        try:
            works = self._batched(transfers) if self.coalesces else [self._one(t) for t in transfers]
        except RuntimeError as exc:
            raise self._error(transfers[0], exc) from exc
        if len(works) == len(transfers):
            for t, w in zip(transfers, works, strict=True):
                t.work = w
        else:  # coalesced into one work (NCCL): every transfer of the batch waits on all of it
            for t in transfers:
                t.work = works
        self.sends += [t for t in transfers if t.is_send]

    def _batched(self, transfers: list[Transfer]) -> list:
        ops = [
            dist.P2POp(dist.isend if t.is_send else dist.irecv, t.tensor, self.global_ranks[t.peer],
                       group=self.group_of(t), tag=t.tag)
            for t in transfers
        ]
        return dist.batch_isend_irecv(ops)

    def _one(self, t: Transfer):
        if t.is_send:
            return dist.isend(t.tensor, self.global_ranks[t.peer], group=self.group_of(t), tag=t.tag)
        return dist.irecv(t.tensor, self.global_ranks[t.peer], group=self.group_of(t), tag=t.tag)

    def wait(self, transfer: Transfer) -> torch.Tensor:
        works = transfer.work if isinstance(transfer.work, list) else [transfer.work]
        deadline = time.monotonic() + self.timeout
        for work in works:
            left = max(deadline - time.monotonic(), 0.001)
            try:
                work.wait(timeout=timedelta(seconds=left))
            except RuntimeError as exc:
                raise self._error(transfer, exc) from exc
        return transfer.tensor

    def release_finished_sends(self) -> None:
        """Drop the sends whose transfer has completed (waiting them: at once, raising a failed one's
        error), so their tensors go now rather than at the end of the step: a stage's output after its
        I, a gradient once handed on. The rest stay for ``wait_sends``."""
        pending = []
        for transfer in self.sends:
            works = transfer.work if isinstance(transfer.work, list) else [transfer.work]
            if all(work.is_completed() for work in works):
                self.wait(transfer)
            else:
                pending.append(transfer)
        self.sends = pending

    def wait_sends(self) -> None:
        sends, self.sends = self.sends, []
        for transfer in sends:
            self.wait(transfer)

    def _error(self, transfer: Transfer, exc: Exception) -> PipelineCommError:
        direction = "sending" if transfer.is_send else "receiving"
        return PipelineCommError(
            f"pipeline rank {self.rank}: {direction} {transfer.label} {'to' if transfer.is_send else 'from'} "
            f"pipeline rank {transfer.peer} failed within timeout={self.timeout:g}s: {str(exc).strip()[:300]}\n"
            "A rank died or stalled, or the ranks run different schedules: check every rank's log for the "
            "first error, and that all ranks pass the same schedule, num_microbatches and batch shape."
        )


def wait_collective(work, timeout: float, what: str, rank: int) -> None:
    """Wait a collective with a deadline, turning failure into ``PipelineCommError``."""
    try:
        work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise PipelineCommError(
            f"rank {rank}: {what} failed within timeout={timeout:g}s: {str(exc).strip()[:300]}\n"
            "A rank died or stalled: check every rank's log for the first error."
        ) from exc
