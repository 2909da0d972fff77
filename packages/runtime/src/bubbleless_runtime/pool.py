"""``RoundRobinPipeline``: RoundPipe's stateless device pool, run for real in one process.

    pipe = RoundRobinPipeline(layers, devices=["cuda:0", "cuda:1"], num_microbatches=8, loss_fn=loss_fn,
                              partition="auto", sample_input=inputs.chunk(8)[0])
    loss = pipe.step(inputs, targets)   # the summed loss; .grad of the caller's parameters is filled
    optimizer.step()

    pipe = RoundRobinPipeline(..., optimizer={"name": "adamw", "lr": 1e-4, "max_grad_norm": 1.0})
    loss = pipe.step(inputs, targets)   # and the host optimizer has stepped the fp32 masters

    pipe = RoundRobinPipeline(..., optimizer={"name": "adamw", "lr": 1e-4, "asynchronous": True})
    for loss in pipe.steps(batches):        # the update from each step's gradients runs during the next
        ...                                 # step, whose first jobs take the devices this one frees first
    pipe.synchronize()                      # the last update applied: read or save the weights now

    for inputs, targets in batches:         # the same one step at a time: no overlap of the steps, so
        loss = pipe.step(inputs, targets)   # plan for it with schedule_options={"objective": "makespan"}

Under the asynchronous optimizer ``partition="auto"`` ranks its plans by the steady period of overlapped
steps (``objective="period"``), which is what ``steps`` (and the Trainer, between its evaluations and
saves) runs; a plan that wins there may take longer for one step alone (the tiny bench profile on 2 CPU
devices: the whole model as one job, period 352.6 ms, one step 705.2 ms, where the makespan plan steps in
360.9 ms), so a loop of ``step`` calls, or ``steps`` over a few batches at a time, should ask for
``objective="makespan"``. The first ``step()`` of a pipeline planned so unasked warns once
(``SINGLE_STEP_WARNING``), unless ``steps`` ran first.

Every weight, gradient and optimizer state lives in host memory (``bubbleless_offload.HostStore``); the
devices are a pool of stateless workers, one thread each, running the jobs the ``roundrobin`` schedule
gives them (``pool_worker``). The same code runs on CPU "devices" (``devices=["cpu"] * 4``) with real
copies, so its logic and gradients are tested on every machine.

Consistency: the forward, recompute and backward of one step all read the weights as they were when the
step began. The host optimizer (if any) steps after the last gradient is down, synchronously by default.
``optimizer={..., "asynchronous": True}`` makes it one step stale, RoundPipe's default
(``bubbleless_offload.host_optimizer_async``): step k's gradients are handed to a CPU thread that
updates the fp32 masters while step k+1 already runs on the weights before that update, and step k+1's
end puts the new weights in front (a pointer swap) before handing off its own gradients; so
``w_{k+1} = w_k - update(g(w_{k-1}))``. It costs 6 more host bytes per trainable bf16 parameter (a
second gradient accumulator and working buffer). ``pipe.synchronize()`` applies the update in flight:
call it before reading or saving the weights (``store.master_state_dict`` and the optimizer's
``state_dict`` call it themselves); the update's exception, if it had one, is raised there or by the
next ``step``. ``last_step_result`` is the ``HostStepResult`` of the latest update applied to the
weights: synchronous, this step's; asynchronous, the previous step's (None after the first step), and
this step's once ``synchronize()`` returns. The fp16 loss scaler is refused with ``asynchronous``.

Overlapped steps (``steps(batches)``, ``pool_overlap``): with the asynchronous optimizer nothing in step
k + 1 needs step k's gradients, so as each device ends its row of step k it takes the next row of step
k + 1; two steps run at once at most, each reading and adding into its own host tensors
(``bubbleless_offload.HostView``), with exactly the arithmetic of ``step()`` in a loop.

Gradient accumulation: with a host optimizer, ``step(..., optimizer_step=False)`` keeps its gradients in
the host accumulators and the next ``step`` adds to them; without one, each step adds into ``.grad``.

Errors: an exception in any worker (an out-of-memory included) stops every other worker at its next
wait, the devices are cleared, the host gradients of the failed step are dropped (with those accumulated
since the last optimizer step), and ``step`` raises that first exception, noting the device and action;
the pipeline is usable for the next ``step``. An update in flight is not touched by a failed step: it
is applied, once, at the end of the next step that succeeds.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence

import torch

from bubbleless_offload import DeviceOutOfMemory, HostStore, MemoryBudget, PinnedPool
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer
from bubbleless_partition import Partition, Profile
from bubbleless_schedules import Costs, Schedule, Span, Timeline, add_weight_transfers, peak_memory, simulate
from bubbleless_schedules.action import STAGE_KINDS
from bubbleless_schedules.roundrobin_layout import PoolGroups, peak_weight_layers, pool_groups

from . import pool_plan
from .arguments import check_common
from .batches import check_batch, signature_of, split_batch
from .collectives import THIS_PROCESS
from .pool_board import Board, PoolAborted
from .pool_memory import check_fits
from .pool_options import asks_asynchronous, host_optimizer, weight_upload_options
from .pool_overlap import check_overlap, overlapped_steps
from .pool_precision import check_step_precision, precisions_of
from .pool_replicas import ReplicaAverager
from .pool_routes import routes_of
from .pool_worker import POOL, DeviceWorker, PoolStep, WorkerState, host_buffer_release, run_worker
from .stages import layers_of

DEFAULT_TIMEOUT = 300.0


def _devices(devices) -> list[torch.device]:
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"devices must be a non-empty list such as ['cuda:0', 'cuda:1'] or ['cpu'] * 4, got {devices!r}")
    resolved = []
    for d in devices:
        try:
            device = torch.device(d)
        except (RuntimeError, TypeError):
            raise ValueError(f"device {d!r} is not a torch device name ('cpu', 'cuda:0', ...)") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {d!r} asked for but no GPU is visible; use devices=['cpu', ...] here")
            index = 0 if device.index is None else device.index
            if index >= torch.cuda.device_count():
                raise ValueError(f"device {d!r}: only {torch.cuda.device_count()} GPUs are visible")
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise ValueError(f"device {d!r}: the pool runs on 'cpu' and 'cuda' devices (ROCm builds name theirs cuda)")
        resolved.append(device)
    return resolved


SINGLE_STEP_WARNING = (
    "RoundRobinPipeline: with the asynchronous optimizer, partition='auto' planned for overlapped steps "
    "(objective='period'), but step() runs one step at a time, where that plan may be slower than the one "
    "planned for single steps; iterate over pipe.steps(batches) to overlap them, or construct the pipeline "
    "with schedule_options={'objective': 'makespan'} (or {'objective': 'period'} to keep this plan and "
    "silence this warning)"
)
"""Warned once, at the first ``step()`` of a pipeline planned for overlapped steps without being asked to
(the module docstring: the tiny bench profile's period plan steps alone in 705.2 ms, the makespan plan in
360.9)."""


class RoundRobinPipeline:
    """A model cut into round-robin jobs over a pool of devices; ``step`` runs one iteration.

    ``model``: an ``nn.Sequential`` or a list of layers (the Hugging Face adapters give these).
    ``partition``: see ``pool_plan`` (``"auto"`` needs ``sample_input``, one micro-batch of inputs).
    ``optimizer``: None (fill ``.grad`` of the caller's parameters, as ``Pipeline`` does) or the keyword
    arguments of ``bubbleless_offload.HostOptimizer`` (``{"name": "adamw", "lr": ...}``), plus
    ``"asynchronous": True`` for the one-step-stale optimizer (module docstring); with it, ``partition="auto"``
    (or a Profile) plans for the overlapped steps it allows (``steps``, as the Trainer runs them): the
    candidates are ranked by their steady-state period, not one step's makespan (``pool_plan``'s
    ``objective``; ``schedule_options={"objective": "makespan"}`` plans for single steps again).
    ``memory_budget``: bytes each device may hold; a plan that cannot fit is refused here, and the
    executor counts every tensor it places at run time (``DeviceOutOfMemory`` from ``step``). None (the
    default): no limit, read from nowhere (not a GPU's free memory either): ``partition="auto"`` plans the
    fastest it finds, as under a budget every layer fits in, and the executor counts without refusing.
    ``precision``: what every ``step`` runs in, "fp32" (no autocast), "bf16" or "fp16" (the caller's
    ``torch.autocast`` at that dtype), so ``partition="auto"`` plans memory for it alone; None (the default)
    plans for the most of the three and lets a step run in any. A step in another precision than the one
    named is refused before it runs (``pool_precision``).
    ``pin_memory``: host weights, and the host buffers activations cross devices through (reused:
    ``host_buffers``), pinned (default: when a GPU is in ``devices``).
    ``frozen_safetensors``: a .safetensors file whose tensors replace the frozen (LoRA base) weights,
    memory-mapped rather than held in RAM; ``safetensors_key`` maps store names to its keys (for a
    Hugging Face model: ``bubbleless_runtime.models.checkpoint_key_of(model, layers)``).
    ``weight_uploads``: how each device's weight copies are issued, the keyword arguments of
    ``bubbleless_offload.WeightUploads`` (``paced``, ``chunk_bytes``, ``window``); by default paced on a GPU
    (32 MiB chunks behind the activation uploads, RoundPipe's rule), at once on CPU.
    ``data_parallel_group``: a gloo process group of replicas, one pool per process (a node's GPUs), each
    stepping on its own share of the global batch from the same initial weights; each step's host gradients
    are averaged over the group before the optimizer (or ``.grad``) reads them (``pool_replicas``). The
    loss returned stays this replica's.
    """

    def __init__(self, model, *, devices, num_microbatches: int, loss_fn: Callable | None,
                 schedule: str | Schedule = "roundrobin", partition="auto", optimizer=None,
                 memory_budget: float | None = None, sample_input=None, costs: Costs | None = None,
                 schedule_options: dict | None = None, pin_memory: bool | None = None,
                 frozen_safetensors=None, safetensors_key: Callable[[str], str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, trace: bool = True, precision: str | None = None,
                 weight_uploads: dict | None = None, data_parallel_group=None) -> None:
        check_common(loss_fn, num_microbatches, timeout)
        self.replicas = None if data_parallel_group is None else ReplicaAverager(data_parallel_group, timeout=timeout)
        weight_uploads = weight_upload_options(weight_uploads)
        self.precisions = precisions_of(precision)
        self.precision = precision
        if memory_budget is not None and not (isinstance(memory_budget, (int, float)) and memory_budget > 0):
            raise ValueError(f"memory_budget is bytes per device and must be positive, got {memory_budget!r}")
        self.devices = _devices(devices)
        self.has_gpu = any(d.type == "cuda" for d in self.devices)  # pinned host buffers, uploads on copy streams
        self.layers = layers_of(model)
        self.num_microbatches = num_microbatches
        self.loss_fn = loss_fn
        self.timeout = float(timeout)
        self.trace = trace
        self.memory_budget = memory_budget
        self.profile: Profile | None = None
        self.stage_costs: Costs | None = costs
        self.input_bytes = _copied_input_bytes(sample_input, self.devices)
        self.plan_objective: str | None = None  # what partition="auto" ranked its plans by (``_plan``)
        self._warn_single_steps = False  # planned for overlapped steps unasked: say so at the first step()
        self.schedule = self._plan(schedule, partition, sample_input, costs, dict(schedule_options or {}),
                                   overlapped=asks_asynchronous(optimizer))
        self.groups: PoolGroups = pool_groups(self.schedule)
        self.partition = self.groups
        pin = self.has_gpu if pin_memory is None else pin_memory
        self.store = HostStore(self.layers, pin_memory=pin, frozen_safetensors=frozen_safetensors,
                               safetensors_key=safetensors_key)
        check_fits(self.schedule, self.store, memory_budget, self.devices, self.profile, self.input_bytes)
        if self.replicas is not None:
            self.replicas.agree([tuple(hp.grad.shape) for hp in self.store.trainable])
        self.optimizer = host_optimizer(self.store, optimizer)
        self.routes = routes_of(self.schedule)
        self.interpreter = POOL
        # with pinning, activations cross devices through reused pinned host buffers, so their copies are
        # asynchronous (pinning per copy would cost more than it saves); unpinned, fresh tensors cost least
        self.host_buffers = PinnedPool(pin=True) if pin else None
        self.workers = [
            DeviceWorker(index=i, device=d, store=self.store, routes=self.routes, actions=self.schedule.actions[i],
                         budget=MemoryBudget(memory_budget, d), pin_memory=pin, uploads=weight_uploads,
                         host_buffers=self.host_buffers)
            for i, d in enumerate(self.devices)
        ]
        self.holds_loss = True
        self.group = THIS_PROCESS  # the Trainer's pipeline collectives: none (``replicas`` averages instead)
        self.num_ranks = 1
        self.last_step_result = None
        self.last_steps_trace = None
        self._last_spans: list | None = None

    # -- planning ------------------------------------------------------------------------------------
    def _plan(self, schedule, partition, sample_input, costs, options, overlapped: bool = False) -> Schedule:
        num_layers, num_devices = len(self.layers), len(self.devices)
        if isinstance(schedule, Schedule):
            if not any(a.kind in STAGE_KINDS for _, _, a in schedule.all_actions()):
                schedule = add_weight_transfers(schedule)  # a hand-written order without LOAD/STORE
            return pool_plan.check_schedule(schedule, num_layers=num_layers, num_devices=num_devices,
                                            num_microbatches=self.num_microbatches)
        if not isinstance(schedule, str):
            raise ValueError(f"schedule must be a schedule name or a Schedule, got {schedule!r}")
        groups = None
        if isinstance(partition, str) and partition == "auto" or isinstance(partition, Profile):
            self.profile = partition if isinstance(partition, Profile) else pool_plan.profile_layers(
                self.layers, sample_input, self.devices[0], self.precisions)
            if self.profile.num_layers != num_layers:
                raise ValueError(f"the profile has {self.profile.num_layers} layers but the model has {num_layers}")
            bandwidth = pool_plan.copy_bandwidth_of(self.profile, self.devices[0])
            # auto_groups holds the plan to 2 x cap = the budget, over the walk check_fits makes below
            cap = None if self.memory_budget is None else self.memory_budget / 2
            if overlapped:  # steps overlap under the asynchronous optimizer: rank plans by their period
                self._warn_single_steps = "objective" not in options
                options = {"objective": "period", **options}  # the caller's own objective wins
            self.plan_objective = options.get("objective", "makespan")
            groups, generated, self.stage_costs = pool_plan.auto_groups(
                self.profile, num_devices=num_devices, num_microbatches=self.num_microbatches, name=schedule,
                options=options, bandwidth=bandwidth, memory_cap=cap, input_bytes=self.input_bytes,
                load_stream=self.has_gpu)  # a GPU's uploads: on a copy stream
            return pool_plan.check_schedule(generated, num_layers=num_layers, num_devices=num_devices,
                                            num_microbatches=self.num_microbatches)
        if isinstance(partition, Partition):
            groups = pool_plan.groups_from_partition(partition)
        elif isinstance(partition, PoolGroups):
            groups = partition
        elif not (partition is None or partition == "even"):
            raise ValueError(
                f"partition {partition!r} is not a round-robin cut; pass 'auto', 'even', a PoolGroups, a "
                "bubbleless_partition Profile, or a Partition from cut(method='roundrobin')"
            )
        generated = pool_plan.generate_pool(schedule, groups, num_layers=num_layers, num_devices=num_devices,
                                            num_microbatches=self.num_microbatches, costs=costs, options=options)
        return pool_plan.check_schedule(generated, num_layers=num_layers, num_devices=num_devices,
                                        num_microbatches=self.num_microbatches)

    # -- running -------------------------------------------------------------------------------------
    def parameters(self):
        """The caller's parameters (each once): host-resident, what ``.grad`` is filled on."""
        return iter([hp.param for hp in self.store.params])

    def step(self, inputs, targets, *, optimizer_step: bool = True):
        """One iteration over ``inputs``/``targets`` (split into the micro-batches); the summed loss."""
        check_batch(inputs, targets, self.num_microbatches)
        autocast = _autocast_dtype(self.devices)
        check_step_precision(self.precision, autocast)
        if self._warn_single_steps:
            self._warn_single_steps = False
            warnings.warn(SINGLE_STEP_WARNING, UserWarning, stacklevel=2)
        micro_inputs = split_batch(inputs, self.num_microbatches, torch.device("cpu"))
        micro_targets = split_batch(targets, self.num_microbatches, torch.device("cpu"))
        if self.optimizer is None:  # each step's gradients go into .grad; a host optimizer zeroes its own
            self.store.zero_grad()
        board = self._board()
        shared = PoolStep(micro_inputs, micro_targets, board, self.loss_fn)
        states = [WorkerState(shared) for _ in self.workers]
        errors: list = [None] * len(self.workers)

        go = threading.Event()  # workers start together, and do nothing if the caller is interrupted first
        finished = [threading.Event() for _ in self.workers]

        def body(index: int) -> None:
            try:
                go.wait()
                if board.failure is None:
                    run_worker(self.workers[index], states[index], self.interpreter, autocast)
            except BaseException as error:  # noqa: BLE001 - handed to the caller below
                errors[index] = error
                board.fail(error)
            finally:
                finished[index].set()

        threads = [threading.Thread(target=body, args=(i,), name=f"bubbleless-pool-{i}", daemon=True)
                   for i in range(len(self.workers))]
        launched = 0
        try:
            for thread in threads:
                thread.start()
                launched += 1
            go.set()
            for done in finished:
                done.wait()
        except BaseException as interrupt:  # Ctrl-C in the caller: stop the workers before leaving
            board.fail(interrupt)
            go.set()
            # Our own events, not Thread.join: a join cut short by KeyboardInterrupt can mark a running
            # thread stopped (CPython's _wait_for_tstate_lock), and the next step would race it. A thread
            # whose start() was cut short may never run: give it a moment, it touches nothing anyway.
            for done in finished[:launched]:
                done.wait()
            if launched < len(finished):
                finished[launched].wait(5.0)
            self._recover()
            board.close()
            raise
        if board.failure is not None:
            self._recover()
            board.close()  # after the devices' copies (reset waits for them): the host buffers go back
            raise self._explain(board.failure, errors, states) from None
        board.close()  # every worker is done with it: what no reader finished goes back to the pool
        try:
            self.store.flush_adds()  # the host adds STORE left to the store's thread
            if self.replicas is not None and (self.optimizer is None or optimizer_step):
                self.replicas.average([hp.grad for hp in self.store.trainable])
        except BaseException:
            self._recover()
            raise
        if self.optimizer is None:
            self.store.grads_to_params()
        elif optimizer_step:
            try:
                self.last_step_result = self.optimizer.step()
            except BaseException:  # an update handed off earlier failed: this step's gradients go too
                self.store.zero_grad()
                raise
        self._last_spans = [s.spans for s in states] if self.trace else None
        self._timeline = None
        return torch.stack([shared.losses[m].float().cpu() for m in range(self.num_microbatches)]).sum()

    def steps(self, batches, *, accumulate: int = 1):
        """Run one step per ``(inputs, targets)`` of ``batches``, each step's first jobs starting on the devices
        the step before leaves free as it drains (``pool_overlap``); yields each step's summed loss when it
        ends and its gradients are handed to the optimizer. Needs the one-step-stale optimizer
        (``optimizer={..., "asynchronous": True}``): the weights and gradients are exactly those of ``step()``
        called per batch. ``accumulate=n``: the optimizer steps after every n-th step. The caller's autocast
        when ``steps`` is called applies to every step. ``last_steps_trace``: the last two steps' actions
        as they ran (``pool_overlap.StepSpan``); ``last_timeline`` the last step's, one row per schedule row."""
        check_overlap(self, accumulate)
        autocast = _autocast_dtype(self.devices)
        check_step_precision(self.precision, autocast)
        self._warn_single_steps = False  # the caller overlaps steps: a step() between runs is no mistake
        return overlapped_steps(self, batches, accumulate, autocast)

    def _keep_trace(self, index: int, spans) -> None:
        self.last_steps_trace = spans if self.trace else None
        if self.trace:
            rows = [[(s.action, s.start, s.end) for s in spans if s.step == index and s.row == r]
                    for r in range(len(self.workers))]
            self._last_spans, self._timeline = rows, None

    def _own_rows(self) -> None:
        """Every device back on its own row, reading the front tensors (what ``step`` runs)."""
        for worker in self.workers:
            worker.take_row(self.schedule.actions[worker.index])

    def synchronize(self):
        """Apply the one-step-stale update in flight, if any (a no-op otherwise); ``last_step_result``."""
        if isinstance(self.optimizer, AsyncHostOptimizer):
            applied = self.optimizer.synchronize()
            if applied is not None:
                self.last_step_result = applied
        return self.last_step_result

    def _explain(self, failure: BaseException, errors, states) -> BaseException:
        """The root failure (never a worker it stopped), noted with its device, action and what to change."""
        for index, error in enumerate(errors):
            if error is not failure or not hasattr(failure, "add_note"):
                continue
            worker, done = self.workers[index], len(states[index].spans)
            action = worker.actions[done] if done < len(worker.actions) else None
            failure.add_note(
                f"raised on {worker.name} of the round-robin pool running {action}; the step was abandoned, the "
                "devices cleared and the step's gradients dropped: the pipeline can run the next step"
            )
            if _out_of_memory(failure):
                g = self.groups
                failure.add_note(
                    f"tried: groups forward={list(g.forward)} last={g.last} backward={list(g.backward)}, "
                    f"{self.num_microbatches} micro-batches of {signature_of(states[index].step.inputs[0])}, "
                    f"memory_budget={self.memory_budget}; use more micro-batches, shorter sequences, or smaller "
                    "groups (more backward groups, or partition='auto' with memory_budget set)"
                )
        assert not isinstance(failure, PoolAborted), "the first failure is a root cause by construction"
        return failure

    def _board(self) -> Board:
        """A step's board, whose payloads' host buffers go back to ``host_buffers`` when read (or closed)."""
        release = None if self.host_buffers is None else host_buffer_release(self.host_buffers)
        return Board(self.timeout, self.routes.readers, release=release)

    def _recover(self) -> None:
        for worker in self.workers:
            worker.reset()
        self.store.zero_grad()

    # -- timelines -----------------------------------------------------------------------------------
    def predicted_timeline(self, costs: Costs | None = None) -> Timeline:
        """The simulator's timeline for this schedule (default: the profiled per-job costs, else unit)."""
        return simulate(self.schedule, costs or self.stage_costs)

    @property
    def last_timeline(self) -> Timeline | None:
        """The measured timeline of the last step: one row per device, LOAD and STORE included."""
        if self._last_spans is None:
            return None
        if getattr(self, "_timeline", None) is None:
            spans = [(w, a, s, e) for w, row in enumerate(self._last_spans) for a, s, e in row]
            origin = min((s for _, _, s, _ in spans), default=0.0)
            self._timeline = Timeline(self.schedule, tuple(Span(w, a, s - origin, e - origin) for w, a, s, e in spans),
                                      peak_memory(self.schedule))
        return self._timeline

    def peak_weight_layers(self) -> tuple[int, ...]:
        return peak_weight_layers(self.schedule)


def _copied_input_bytes(sample_input, devices) -> int:
    """Bytes of the copy of one caller's micro-batch a worker places at layer 0 (``pool_worker``), for the
    memory plan: ``sample_input``'s on a pool with a GPU, 0 where every device is the CPU (its workers read
    the caller's batch where it is) or no sample is given (a profile or a cut passed as ``partition=``)."""
    if sample_input is None or all(d.type == "cpu" for d in devices):
        return 0
    tensors = (sample_input,) if isinstance(sample_input, torch.Tensor) else tuple(sample_input)
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _out_of_memory(error: BaseException) -> bool:
    cuda_oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(error, (DeviceOutOfMemory, cuda_oom, MemoryError))


def _autocast_dtype(devices) -> torch.dtype | None:
    """The caller's autocast dtype for the pool's device type (worker threads do not inherit it)."""
    kind = devices[0].type
    try:
        enabled = torch.is_autocast_enabled(kind)
    except TypeError:  # torch < 2.4 has no device argument
        enabled = torch.is_autocast_enabled() if kind == "cuda" else torch.is_autocast_cpu_enabled()
    if not enabled:
        return None
    try:
        return torch.get_autocast_dtype(kind)
    except AttributeError:
        return torch.get_autocast_gpu_dtype() if kind == "cuda" else torch.get_autocast_cpu_dtype()


__all__ = ["DEFAULT_TIMEOUT", "RoundRobinPipeline"]
