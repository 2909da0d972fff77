"""``Pipeline``: run any stage-bound schedule for real, one process per rank.

    pipe = Pipeline(model, schedule="zbv", num_microbatches=8, loss_fn=loss_fn)
    loss = pipe.step(inputs, targets)   # the summed loss on the rank holding the last stage, else None
    optimizer.step()                    # .grad of the caller's own parameters is filled

    pipe = Pipeline(model, schedule="zbv", num_microbatches=8, loss_fn=loss_fn,
                    partition="auto", sample_input=inputs.chunk(8)[0])   # profiled and cut, see auto_partition

Everything the caller can get wrong is checked in the constructor or at the top of ``step``, on every
rank, before any communication, so a bad argument is a ``ValueError`` everywhere instead of a hang.
What only shows while a step runs (a ``loss_fn`` that returns a non-scalar, a layer that returns a
dict) raises on the rank that meets it; its peers then raise ``PipelineCommError`` when that process
exits, or after ``timeout`` seconds if it stays alive, naming the transfer they waited for. The
constructor's profiling (``partition="auto"``) and the first step wait up to ``first_step_timeout``
instead (default: ``timeout``), as they include one-off work (profiling, compilation, allocator warm-up).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
import torch.distributed as dist

from bubbleless_schedules import Costs, Schedule, add_communication, generate, simulate, validate
from bubbleless_schedules.action import COMM_KINDS, COMPUTE_KINDS, Kind
from bubbleless_schedules.layouts import is_lowered

from . import stages as stages_mod
from .arguments import check_common, check_microbatches, require_stage_bound, stage_bound_names  # noqa: F401
from .auto_partition import auto_cut, stage_costs
from .batches import check_batch, signature_of, split_batch
from .collectives import backend_device
from .comm import Channel, PipelineCommError, direction_groups, wait_collective
from .data_parallel import GradientAverager
from .executor import Executor, StepState
from .interpreter import Interpreter
from .trace import measured_timeline

DEFAULT_TIMEOUT = 300.0


def _lower(schedule: Schedule) -> Schedule:
    """The schedule with its sends and receives: as given when it is lowered already (``meta.comm=1``,
    which ``add_communication`` writes and CSV/text keep); ``add_communication`` refuses anything else
    that carries sends or receives, saying so."""
    return schedule if is_lowered(schedule) else add_communication(schedule)


def _group_shape(group) -> tuple[int, int]:
    """(rank in the pipeline group, group size); (0, 1) when torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _validate(schedule: Schedule) -> None:
    """``bubbleless_schedules.validate`` over the actions a stage-bound layout gives meaning to (F, I, W, B,
    sends and receives): a kind it does not know (R, say) is left to the interpreter, which runs it with a
    user's handler or refuses it naming the action."""
    known = (COMPUTE_KINDS - {Kind.R}) | COMM_KINDS
    if schedule.layout == "pipeline" and any(a.kind not in known for _, _, a in schedule.all_actions()):
        schedule = schedule.replace(actions=tuple(tuple(a for a in row if a.kind in known) for row in schedule.actions))
    validate(schedule)


def _resolve_schedule(schedule, *, num_ranks, num_microbatches, costs, options) -> Schedule:
    if isinstance(schedule, str):
        generated = generate(schedule, num_ranks=num_ranks, num_microbatches=num_microbatches, costs=costs, **options)
        return require_stage_bound(generated)
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a name from bubbleless_schedules.available() or a Schedule, got {schedule!r}")
    _validate(schedule)  # a cycle or a missing action: the validator's rendered message, before any step
    require_stage_bound(schedule)
    if schedule.num_ranks != num_ranks:
        raise ValueError(
            f"schedule {schedule.name!r} is for {schedule.num_ranks} ranks but the pipeline group has {num_ranks}; "
            f"generate it with num_ranks={num_ranks} or launch {schedule.num_ranks} processes"
        )
    check_microbatches(schedule, num_microbatches)
    return schedule


class Pipeline:
    """This rank's share of a pipelined model, and the interpreter that runs a schedule over it.

    ``partition``: ``None`` or ``"even"`` (equal layer counts), a list of layer counts per stage, an object
    with ``.sizes`` (a ``bubbleless_partition.Partition``), or ``"auto"``: rank 0 profiles the layers on
    ``sample_input`` (one micro-batch of inputs) in this constructor and every rank cuts that profile the
    same way, for the schedule's placement, under ``memory_cap`` bytes per stage (per rank for a V) when
    given (``auto_partition`` says why). A named ``schedule`` (without ``costs``) is then generated again
    for the cut's profiled per-stage costs, and kept where the simulator predicts it faster than the
    unit-cost one (``schedule_before_profile``). ``partition`` keeps the sizes used; ``profile`` and
    ``stage_costs`` (per-stage simulator ``Costs``, ms) are set with ``"auto"``, else None.

    ``trace``: keep each step's compute spans on this rank (free: the executor times its actions anyway)
    so that ``last_timeline`` can gather them; False leaves ``last_timeline`` None. A step never
    communicates for the trace; reading ``last_timeline`` does, once per step (see there).

    ``prefetch``: how many compute actions ahead receives are posted (default: 2 on gloo, 0 otherwise,
    see ``_default_prefetch``). ``interpreter``: the handler table the executor runs (default
    ``executor.INTERPRETER``); ``INTERPRETER.with_handler(kind, fn)`` adds or wraps a kind, with
    ``fn(executor, action, state)`` as every handler (``interpreter`` says the contract).
    """

    def __init__(
        self,
        model,
        *,
        schedule: str | Schedule,
        num_microbatches: int,
        loss_fn: Callable | None,
        partition=None,
        sample_input=None,
        memory_cap: float | None = None,
        group=None,
        device=None,
        data_parallel_group=None,
        costs: Costs | None = None,
        schedule_options: dict | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        first_step_timeout: float | None = None,
        trace: bool = True,
        prefetch: int | None = None,
        interpreter: Interpreter | None = None,
    ) -> None:
        check_common(loss_fn, num_microbatches, timeout)
        first_step_timeout = timeout if first_step_timeout is None else first_step_timeout
        check_common(loss_fn, num_microbatches, first_step_timeout)
        self.rank, self.num_ranks = _group_shape(group)
        self.schedule = _resolve_schedule(
            schedule, num_ranks=self.num_ranks, num_microbatches=num_microbatches,
            costs=costs, options=dict(schedule_options or {}),
        )
        layers = stages_mod.layers_of(model)
        self.profile = self.stage_costs = None
        self.schedule_before_profile = self.schedule
        if isinstance(partition, str) and partition == "auto":
            generate_for = None
            if isinstance(schedule, str) and costs is None:  # a named schedule: regenerate it for the profile
                def generate_for(profiled: Costs) -> Schedule:
                    return _resolve_schedule(schedule, num_ranks=self.num_ranks, num_microbatches=num_microbatches,
                                             costs=profiled, options=dict(schedule_options or {}))
            partition, self.profile, self.schedule = auto_cut(
                layers, self.schedule, sample_input, memory_cap=memory_cap, rank=self.rank,
                num_ranks=self.num_ranks, group=group, data_parallel_group=data_parallel_group, timeout=first_step_timeout,
                generate_for=generate_for,
            )
            self.stage_costs = stage_costs(self.profile, partition.sizes)
        elif memory_cap is not None:
            raise ValueError(f"memory_cap applies to partition='auto' only (partition is {partition!r}); "
                             "drop memory_cap or pass partition='auto'")
        self.stage_sizes = stages_mod.stage_sizes(len(layers), self.schedule.num_stages, partition)
        self.partition = self.stage_sizes
        self.stages = self.schedule.stages_of(self.rank)
        stage_modules = stages_mod.cut(layers, self.stage_sizes, self.stages)
        if device is not None:
            for module in stage_modules.values():
                module.to(device)
        self.device = torch.device(device) if device is not None else _device_of(stage_modules)
        self.modules = [stage_modules[s] for s in self.stages]
        self.num_microbatches = num_microbatches
        self.loss_fn = loss_fn
        self.costs = costs
        self.timeout = float(timeout)
        self.first_step_timeout = float(first_step_timeout)
        self._wait = self.first_step_timeout  # what waits are bounded by now: timeout after the first step
        self.trace = trace
        self.group = group  # None: the default group
        self.holds_loss = self.schedule.stage_to_rank[-1] == self.rank
        self.lowered = _lower(self.schedule)
        self._last_spans: list | None = None  # this rank's spans of the last step (trace=True)
        self._timeline = None  # the gathered timeline of that step, once read
        self._checked: set = set()
        self._averager = None
        if data_parallel_group is not None:
            self._averager = GradientAverager(data_parallel_group, stage_modules, timeout=self._wait, rank=self.rank)
        channel = None
        if self.num_ranks > 1:
            upward, downward = direction_groups(self.group, self.timeout)
            channel = Channel(upward, self._wait, self.rank, downward=downward)
        self._executor = Executor(
            rank=self.rank, lowered=self.lowered, modules=stage_modules, loss_fn=loss_fn, channel=channel,
            on_stage_done=self._averager.stage_done if self._averager else (lambda stage: None),
            prefetch=_default_prefetch(self.group) if prefetch is None else prefetch, interpreter=interpreter,
        )

    def parameters(self):
        """This rank's parameters (each once)."""
        seen = set()
        for module in self.modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def predicted_timeline(self, costs: Costs | None = None):
        """The simulator's timeline for this schedule under ``costs`` (default: the constructor's, else the
        auto partition's profiled ``stage_costs``, else unit)."""
        return simulate(self.schedule, costs or self.costs or self.stage_costs)

    def step(self, inputs, targets):
        """Run the schedule over one batch; returns the summed loss on the loss-holding rank, else None."""
        check_batch(inputs, targets, self.num_microbatches)
        micro_inputs = split_batch(inputs, self.num_microbatches, self.device)
        micro_targets = split_batch(targets, self.num_microbatches, self.device)
        signature = signature_of(micro_inputs[0])
        if self.num_ranks > 1 and signature not in self._checked:
            self._check_ranks_agree(signature)
            self._checked.add(signature)
        state = StepState(micro_inputs, micro_targets, signature, device=self.device)
        self._executor.run(state)
        if self._executor.channel is not None:
            self._executor.channel.wait_sends()
        if self._averager is not None:
            self._averager.finish()
        self._last_spans, self._timeline = (state.spans if self.trace else None), None
        if self._wait != self.timeout:  # the first step is done: steady-state deadlines from now on
            self._set_wait(self.timeout)
        if not self.holds_loss:
            return None
        return torch.stack([state.losses[m] for m in range(self.num_microbatches)]).sum()

    def _set_wait(self, seconds: float) -> None:
        self._wait = seconds
        if self._executor.channel is not None:
            self._executor.channel.timeout = seconds
        if self._averager is not None:
            self._averager.timeout = seconds

    @property
    def last_timeline(self):
        """The measured ``Timeline`` of the last step, every rank's spans (None before a step or with
        ``trace=False``).

        Collective on the pipeline group the first time it is read after a step (one all-gather; later
        reads return the same object): every rank of the group must read it after the same step, in the
        same order relative to the group's other collectives, e.g. right after ``step`` on every rank as
        the CLI and the benchmarks do. A rank reading it alone waits for the others and raises
        ``PipelineCommError`` after ``timeout``. Steps themselves never gather, so tracing costs nothing
        until it is read.
        """
        if self._last_spans is None:
            return None
        if self._timeline is None:
            self._timeline = measured_timeline(
                self.schedule, self._last_spans, distributed=self.num_ranks > 1, group=self.group,
                rank=self.rank, timeout=self.timeout,
            )
        return self._timeline

    def _check_ranks_agree(self, signature) -> None:
        """One small all-gather: every rank must run the same lowered schedule on the same batch shape."""
        text = f"{self.lowered.to_text()}|{self.num_microbatches}|{signature}|{self.stage_sizes}"
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")
        mine = torch.tensor([digest], dtype=torch.int64, device=backend_device(self.group))
        gathered = [torch.empty_like(mine) for _ in range(self.num_ranks)]
        work = dist.all_gather(gathered, mine, group=self.group, async_op=True)
        wait_collective(work, self._wait, "checking that all ranks run the same schedule", self.rank)
        values = [int(t) for t in gathered]
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            raise ValueError(
                f"pipeline ranks {differ} disagree with rank 0 on the schedule, num_microbatches, partition or "
                f"batch shape (this is rank {self.rank}, running {self.schedule.name or 'a custom schedule'!r} "
                f"with {self.num_microbatches} micro-batches, stage sizes {self.stage_sizes}, batch {signature}); "
                "every rank must pass the same ones"
            )


def _default_prefetch(group) -> int:
    """How many compute actions ahead receives are posted. On gloo every message has its own tag, so
    posting early is safe and overlaps transfers with compute; NCCL matches by posting order on one
    stream per peer pair, where a receive hoisted above a send to the same peer could deadlock."""
    if not dist.is_initialized():
        return 0
    return 2 if dist.get_backend(group) == "gloo" else 0


def _device_of(stage_modules) -> torch.device:
    for module in stage_modules.values():
        for p in module.parameters():
            return p.device
    return torch.device("cpu")


__all__ = ["DEFAULT_TIMEOUT", "Pipeline", "PipelineCommError"]
