"""The device pool's back end: one ``DeviceWorker`` per device, its handlers, run by the interpreter core.

A worker runs its device's actions of a round-robin schedule (``bubbleless_schedules`` generator
``roundrobin``) in order, on its own thread:

- ``LOAD j``: upload job j's weights (``bubbleless_offload.DeviceWeights``) unless prefetched, then
  prefetch the device's next job, so at most two jobs' weights sit on the device.
- ``F`` of a forward job: no graph; the activations entering the layers where a backward group (or
  the last group) starts, and the job's output, go to host memory as the F event's payload.
- ``F`` then ``B`` of the last group: forward with a graph, the loss, its backward; the gradient of the
  group's input goes to host as the G event.
- ``R`` then ``B`` of a backward group: recompute the forward from the saved host activation, then
  backpropagate the gradient the job above left on the board.
- ``I`` then ``W`` instead of ``B`` (a schedule made with ``split_backward``): the micro-batch's forward
  with a graph (R, or the last group's F) defers its linear layers' weight gradients; I backpropagates
  and hands the input gradient on, W (later, in a wait) computes the weight gradients (``pool_split``).
- ``STORE j``: add the job's weight gradients into the host's fp32 accumulators and drop its weights
  (a forward job's weights are dropped after its last F); every W of the job on the device ran before.
  On an accelerator the worker only queues the copies: the host adds run on the store's adds thread
  (``HostStore.adds``), which the step waits for before anything reads the sums.

What an action waits for and where its tensors come from is ``pool_routes`` (the layout's events);
activations cross devices only through the board's host copies, so devices run as a wavefront.
Every tensor placed on the device is counted against the device's ``MemoryBudget``: weights by
``DeviceWeights``, uploaded inputs and the activations autograd saves (through saved-tensor hooks,
which are per thread: ``bubbleless_partition``'s ``SavedStorages``, each storage once, an uploaded input
not again) here, and what a deferred W keeps from its I until it runs (``pool_split``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from bubbleless_offload import (
    DeviceStreams,
    DeviceWeights,
    MemoryBudget,
    PinnedPool,
    WeightUploads,
    stream_context,
    to_device,
    to_host,
)
from bubbleless_partition.saved_tensors import SavedStorages
from bubbleless_schedules import Action, Kind

from .comm import as_tuple
from .interpreter import Interpreter
from .pool_board import Board
from .pool_routes import Routes
from .pool_split import Deferred


def _carries_grad(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


@dataclass(frozen=True)
class HostActivation:
    """Host copies of an activation (a Tensor or a tuple of them) and the event their copy completes."""

    tensors: tuple
    is_tuple: bool
    ready: object

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class PoolStep:
    """What every worker of one step shares."""

    inputs: list
    targets: list
    board: Board
    loss_fn: object
    losses: dict = field(default_factory=dict)


@dataclass
class WorkerState:
    """One worker's share of one step: the interpreter's state."""

    step: PoolStep
    spans: list = field(default_factory=list)
    blocked: float = 0.0


class DeviceWorker:
    """One device of the pool: its weights, streams, memory budget and the graphs of its running job."""

    def __init__(self, *, index: int, device: torch.device, store, routes: Routes, actions, budget: MemoryBudget,
                 pin_memory: bool = False, uploads: dict | None = None, host_buffers: PinnedPool | None = None) -> None:
        self.index = index
        self.device = device
        self.routes = routes
        self.groups = routes.groups
        self.budget = budget
        self.streams = DeviceStreams(device)
        self.weights = DeviceWeights(store, device, streams=self.streams, budget=budget,
                                     uploads=WeightUploads(self.streams, **(uploads or {})))
        self.pin_memory = pin_memory
        self.host_buffers = host_buffers  # where activations going to the host land (None: new tensors)
        self.unposted: list = []  # host tensors of the running action's downloads, not yet on the board
        self.loaded: dict = {}  # job -> LoadedJob on this device
        self.graphs: dict = {}  # (job, mb) -> (roots, leaves, root grads or None) from R or the last F until B
        self.reserved: dict = {}  # (job, mb) -> activation bytes reserved on the budget
        self.deferred: dict = {}  # (job, mb) -> Deferred: weight gradients queued by the forward, run by W
        self.finished: set = set()  # jobs whose weights this step already dropped (never re-prefetched)
        self.name = f"device {index} ({device})"
        self.take_row(actions)

    def take_row(self, actions, view=None) -> None:
        """Run ``actions`` (one row of the schedule) next, reading and adding into ``view``'s host tensors
        (``bubbleless_offload.HostView``; None: the callers' parameters and the front accumulators). A
        device of the pool is stateless between rows: overlapped steps deal it any row of the next step."""
        self.actions = tuple(actions)
        self.view = view
        jobs = list(dict.fromkeys(a.stage for a in self.actions))
        self.next_job = dict(zip(jobs, jobs[1:], strict=False))
        self.job_index = {job: i for i, job in enumerate(jobs)}
        self.last_action = {a.stage: a for a in self.actions}  # a job's weights go after its last action here
        self.finished.clear()

    # -- the interpreter's back-end interface --------------------------------------------------------
    def post(self, work) -> None:  # pool handlers finish their own work (copies are stream-ordered)
        for event in work:
            event.synchronize()

    def reset(self) -> None:
        """Drop everything a failed step left on the device, so the next step starts clean (its copies
        done first: the host buffers they read or write go back to the pool with the step's board)."""
        if self.device.type == "cuda":
            with contextlib.suppress(RuntimeError):  # a faulted device: the step raises its own error
                torch.cuda.synchronize(self.device)
        if self.host_buffers is not None:  # downloads of the failed action, never posted
            for tensor in self.unposted:
                self.host_buffers.release(tensor)
        self.unposted.clear()
        self.finished.clear()
        self.graphs.clear()
        for deferred in self.deferred.values():
            deferred.drop(self.budget)
        self.deferred.clear()
        for nbytes in self.reserved.values():
            self.budget.free(nbytes)
        self.reserved.clear()
        for loaded in self.loaded.values():
            self.weights.release(loaded)
        self.loaded.clear()

    # -- helpers -------------------------------------------------------------------------------------
    def _wait(self, action: Action, state: WorkerState) -> dict:
        """Payloads of the board events ``action`` waits for, adding the seconds waited to ``blocked``."""
        payloads = {}
        for event in self.routes.waits[action]:
            payload, waited = state.step.board.get(event, f"{self.name} running {action}")
            state.blocked += waited
            payloads[event] = payload
        return payloads

    def _publish(self, action: Action, state: WorkerState, payload=None) -> None:
        """Post every event ``action`` produces (the layout's list); the payload rides on the first, and its
        host tensors are the board's from here on."""
        for position, event in enumerate(self.routes.produces[action]):
            state.step.board.put(event, payload if position == 0 else None)
        self.unposted.clear()

    def _job(self, job: int):
        loaded = self.loaded[job]
        loaded.ready.wait(self.streams.compute)
        return loaded

    def _upload(self, payload: HostActivation, what: str):
        """``payload`` on the device, its bytes reserved: (value, bytes, the event of the copy's end)."""
        payload.ready.synchronize()
        self.budget.reserve(payload.nbytes, what)
        tensors, arrived = self._activations_in(payload.tensors)
        return (tuple(tensors) if payload.is_tuple else tensors[0]), payload.nbytes, arrived

    def _activations_in(self, host_tensors) -> tuple[list, object]:
        """Host tensors copied to the device on ``activations_in`` ahead of the weight chunks not yet issued
        (held while they are queued, then ordered after them on the device), the compute stream made to
        wait for them: (the device tensors, the event of the copies' end)."""
        with self.weights.uploads.activation_first(), stream_context(self.streams.activations_in):
            moved = [to_device(t, self.device, stream=self.streams.activations_in, used_on=self.streams.compute)[0]
                     for t in host_tensors]
        arrived = self.streams.record(self.streams.activations_in)
        arrived.wait(self.streams.compute)
        return moved, arrived

    def _download(self, activation) -> HostActivation:
        self.streams.record(self.streams.compute).wait(self.streams.out)
        tensors = []
        with stream_context(self.streams.out):
            for t in as_tuple(activation):
                host, _ = to_host(t.detach(), stream=self.streams.out, pool=self.host_buffers)
                self.unposted.append(host)
                tensors.append(host)
        return HostActivation(tuple(tensors), isinstance(activation, (tuple, list)), self.streams.record(self.streams.out))

    def _input(self, action: Action, state: WorkerState, payloads: dict, at_layer: int):
        """The input of ``action``'s micro-batch on the device and its bytes, reserved on the budget and
        noted in ``reserved`` (so a step that fails before they are freed gives them back in ``reset``)."""
        event = self.routes.input_event[action]
        if event is None:  # the job starts at layer 0: the caller's micro-batch, in host memory
            activation, nbytes = self._batch_on_device(state.step.inputs[action.microbatch],
                                                       f"{action}'s copy of the caller's micro-batch")
        else:
            activation, nbytes, arrived = self._upload(payloads[event][at_layer], f"the input of {action}")
            state.step.board.read_done(event, arrived)
        self.reserved[(action.stage, action.microbatch)] = nbytes
        return activation, nbytes

    def _batch_on_device(self, batch, what: str):
        """The caller's micro-batch (a tensor or a tuple of them) on this device (``_caller_tensor``), and its
        bytes: the copy is the pool's, reserved on the budget here and released as an upload is. A CPU
        device uses the batch as it is (0 bytes)."""
        if self.device.type == "cpu":
            return batch, 0
        tensors = as_tuple(batch)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.budget.reserve(nbytes, what)
        moved = tuple(self._caller_tensor(t) for t in tensors)
        return (moved if isinstance(batch, tuple) else moved[0]), nbytes

    def _caller_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """A caller's tensor (a micro-batch, a target) on this device, ordered before the compute stream's
        next work. A host tensor goes through a pinned buffer of ``host_buffers`` on ``activations_in``, so
        the copy neither blocks this thread nor waits for the compute stream to drain, as a copy from
        pageable memory would; the buffer goes back once the copy is done."""
        if tensor.device == self.device:
            return tensor
        if tensor.device.type != "cpu" or self.host_buffers is None:
            with stream_context(self.streams.compute):
                return tensor.to(self.device)
        staged = self.host_buffers.acquire(tensor.shape, tensor.dtype)
        staged.copy_(tensor)
        (moved,), arrived = self._activations_in((staged,))
        self.host_buffers.release(staged, after=(arrived,))
        return moved

    def _release_if_done(self, action: Action) -> None:
        if self.last_action[action.stage] == action and action.stage in self.loaded:
            self.weights.release(self.loaded.pop(action.stage))
            self.finished.add(action.stage)
            self._prefetch()

    def _prefetch(self) -> None:
        """Upload the job after the latest loaded one while fewer than two jobs' weights are here. A
        schedule may start the next job's recompute before this job ends (``roundrobin`` with layer
        costs): its LOAD then finds the weights prefetched and must not bring a third job. A job started
        after the latest may have ended first (a split backward's W ends a job late): the next is then
        the first one after it not yet ended."""
        if not self.loaded or len(self.loaded) >= 2:
            return
        latest = max(self.loaded, key=self.job_index.__getitem__)
        upcoming = self.next_job.get(latest)
        while upcoming in self.finished:
            upcoming = self.next_job.get(upcoming)
        if upcoming is not None and upcoming not in self.loaded:
            self.loaded[upcoming] = self.weights.load(self.groups.layers(upcoming), self.view)

    def _leaves(self, x):
        tensors = as_tuple(x)
        leaves = tuple(t.detach().requires_grad_(_carries_grad(t)) for t in tensors)
        return (leaves if isinstance(x, (tuple, list)) else leaves[0]), leaves

    def _saving(self, action: Action, loaded, inputs, input_bytes: int) -> SavedStorages:
        """What micro-batch ``action``'s forward with a graph saves, reserved on the budget as autograd saves
        it: each storage on this device once, the job's weights and buffers left out, and its input
        ``inputs`` not: it is reserved since its upload, or its copy of the caller's micro-batch at layer 0
        (``input_bytes``; 0 on a CPU device, which reads the caller's batch as it is).
        Every forward of the micro-batch runs inside it (``_graph_forward``); its bytes go back with B or I."""
        key = (action.stage, action.microbatch)
        self.reserved[key] = input_bytes
        given = {t.untyped_storage().data_ptr() for t in inputs}
        deferred = self.deferred.setdefault(key, Deferred()) if key in self.routes.split_backward else None
        what = f"the activations {action} saves for its backward"

        def on_save(t: torch.Tensor, added: int) -> None:
            if not added:  # a storage counted already
                return
            handed_in = t.untyped_storage().data_ptr() in given
            if deferred is not None and (input_bytes or not handed_in):
                # the input too, a W may keep it, unless it is the caller's batch read where it lies (a CPU
                # worker at layer 0, input_bytes 0): no upload of the pool's, and its storage is the whole
                # batch's (a chunk's view), which held every micro-batch's rows against one of them
                deferred.note(t)
            if not handed_in:
                self.budget.reserve(added, what)
                self.reserved[key] += added

        weights = [t for module in loaded.modules for t in (*module.parameters(), *module.buffers())]
        return SavedStorages(excluded=weights, device=self.device, on_save=on_save)

    def _graph_forward(self, action: Action, activation, modules, saving: SavedStorages, *, defer: bool = True):
        """``modules`` over ``activation`` with a graph, what autograd saves counted by ``saving``. A
        micro-batch whose backward is split runs them deferring its weight gradients (``pool_split``),
        unless ``defer`` is False (the LM head: its I computes its weight gradient at once)."""
        deferred = self.deferred.get((action.stage, action.microbatch)) if defer else None
        with saving, deferred.deferral() if deferred is not None else contextlib.nullcontext():
            for module in modules:
                activation = module(activation)
        return activation

    def _finish_backward(self, action: Action, state: WorkerState, roots, grads, leaves) -> None:
        pairs = [(r, g) for r, g in zip(roots, grads, strict=True) if r.requires_grad]
        if pairs:
            torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
        j, m = action.stage, action.microbatch
        payload = None
        if self.routes.needs_input_grad.get(j):
            payload = self._download(tuple(
                leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves if _carries_grad(leaf)
            ))
        self.budget.free(self.reserved.pop((j, m), 0))
        self._publish(action, state, payload)


def host_buffer_release(pool: PinnedPool):
    """The board's ``release`` for payloads whose host tensors came from ``pool``: each goes back once its
    own copy down and every reader's copy up have completed."""

    def release(payload, copied: tuple) -> None:
        activations = payload.values() if isinstance(payload, dict) else (payload,)
        for activation in activations:
            if isinstance(activation, HostActivation):
                for tensor in activation.tensors:
                    pool.release(tensor, after=(activation.ready, *copied))

    return release


# -- handlers: handler(worker, action, state) ---------------------------------------------------------
def load(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    job = action.stage
    if job not in worker.loaded:
        worker.loaded[job] = worker.weights.load(worker.groups.layers(job), worker.view)
    worker._prefetch()
    worker._publish(action, state)


def forward(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    if worker.groups.role(action.stage) == "last":
        return forward_last(worker, action, state)
    j = action.stage
    payloads = worker._wait(action, state)
    layers = worker.groups.layers(j)
    x, _ = worker._input(action, state, payloads, layers.start)  # queued before the wait for the weights
    loaded = worker._job(j)
    saves, saved = worker.routes.saves[j], {}
    with torch.no_grad(), stream_context(worker.streams.compute):
        for index, module in zip(layers, loaded.modules, strict=True):
            if index in saves:
                saved[index] = worker._download(x)
            x = module(x)
        saved[layers.stop] = worker._download(x)
    worker.budget.free(worker.reserved.pop((j, action.microbatch)))
    worker._publish(action, state, saved)
    worker._release_if_done(action)


def forward_last(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    """The last group's forward and loss. When the loss offers ``fused_head_backward`` for the group's
    last layer (``CausalLMLoss`` with a ``HeadLayer``), the head and loss run forward and backward chunk
    by chunk here, so the full logits never exist, and B continues from the head's input gradient.
    Either way the group's last layer runs outside a split backward's deferral: its I computes the
    head's weight gradient, so W never keeps the logits-sized output gradient."""
    j, m = action.stage, action.microbatch
    payloads = worker._wait(action, state)
    x, nbytes = worker._input(action, state, payloads, worker.groups.layers(j).start)
    loaded = worker._job(j)
    activation, leaves = worker._leaves(x)
    loss_fn, modules = state.step.loss_fn, loaded.modules
    fused = getattr(loss_fn, "fused_head_backward", None)
    target = state.step.targets[m]  # its copy is ordered before the loss reads it
    target = tuple(map(worker._caller_tensor, target)) if isinstance(target, tuple) else worker._caller_tensor(target)
    with stream_context(worker.streams.compute):
        saving = worker._saving(action, loaded, leaves, nbytes)
        body = worker._graph_forward(action, activation, modules[:-1], saving)
        result = None if fused is None else fused(modules[-1], body, target)
        if result is None:  # the head outside the deferral: its W would keep the logits-sized gradient
            loss = loss_fn(worker._graph_forward(action, body, modules[-1:], saving, defer=False), target)
            roots, grads = (loss,), (None,)
        else:
            loss, grads = result
            roots = tuple(t for t in as_tuple(body) if _carries_grad(t))
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError("loss_fn must return a scalar Tensor (sum or mean over the micro-batch)")
    state.step.losses[m] = loss.detach()
    worker.graphs[(j, m)] = (roots, leaves, grads)
    worker._publish(action, state)


def recompute(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    j, m = action.stage, action.microbatch
    payloads = worker._wait(action, state)
    x, nbytes = worker._input(action, state, payloads, worker.groups.layers(j).start)
    loaded = worker._job(j)
    activation, leaves = worker._leaves(x)
    with stream_context(worker.streams.compute):
        out = worker._graph_forward(action, activation, loaded.modules, worker._saving(action, loaded, leaves, nbytes))
    worker.graphs[(j, m)] = (tuple(t for t in as_tuple(out) if _carries_grad(t)), leaves, None)
    worker._publish(action, state)


def backward(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    """B, and I of a split backward (its forward deferred the linear layers' weight gradients)."""
    j, m = action.stage, action.microbatch
    payloads = worker._wait(action, state)
    roots, leaves, grads = worker.graphs.pop((j, m))
    event = worker.routes.grad_event[action]
    with stream_context(worker.streams.compute):
        if event is not None:  # else the last group: grads start at the loss (or the fused head's input)
            grads, nbytes, arrived = worker._upload(payloads[event], f"the output gradient of {action}")
            state.step.board.read_done(event, arrived)
            worker.reserved[(j, m)] = worker.reserved.get((j, m), 0) + nbytes
            grads = as_tuple(grads)
        worker._finish_backward(action, state, roots, grads, leaves)


def backward_input(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    """I: B without the deferred weight gradients; what they keep stays counted on the budget until W."""
    key = (action.stage, action.microbatch)
    if key not in worker.deferred:
        raise ValueError(f"{worker.name}: {action} runs without a forward with a graph of job {action.stage} "
                         f"micro-batch {action.microbatch} before it on this device (its R, or the last group's F, "
                         "defers the weight gradients I leaves to W); put that forward first")
    backward(worker, action, state)  # returns with the graph and its tensors dropped: only W's are alive
    worker.deferred[key].hold(worker.budget, f"the tensors {action} keeps for W")


def backward_weight(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    """W: the weight gradients micro-batch m's forward deferred, computed after its I on this device."""
    worker._wait(action, state)
    key = (action.stage, action.microbatch)
    if key not in worker.deferred or not worker.deferred[key].input_done:
        raise ValueError(f"{worker.name}: {action} runs without its input half I of job {action.stage} "
                         f"micro-batch {action.microbatch} before it on this device; put the I first")
    with stream_context(worker.streams.compute):
        worker.deferred[key].run(worker.budget)
    del worker.deferred[key]  # after it ran: a W that fails leaves its bytes for ``reset`` to give back
    worker._publish(action, state)


def store(worker: DeviceWorker, action: Action, state: WorkerState) -> None:
    pending = sorted(m for j, m in worker.deferred if j == action.stage)
    if pending:
        raise ValueError(f"{worker.name}: {action} would store job {action.stage}'s gradients before the W of "
                         f"micro-batches {pending}; a job's STORE goes after all its W on the device")
    worker._wait(action, state)
    loaded = worker.loaded.pop(action.stage)
    worker.weights.store_grads(loaded)  # on an accelerator the host adds run on the store's thread
    worker.weights.release(loaded)
    worker.finished.add(action.stage)
    worker._prefetch()
    worker._publish(action, state)


POOL = Interpreter(
    name="the device-pool executor",
    handlers={Kind.LOAD: load, Kind.F: forward, Kind.R: recompute, Kind.B: backward, Kind.I: backward_input,
              Kind.W: backward_weight, Kind.STORE: store},
)
"""The pool back end's handler table (``POOL.with_handler(kind, fn)`` plugs in another kind)."""


def run_worker(worker: DeviceWorker, state: WorkerState, interpreter: Interpreter, autocast) -> None:
    """A worker thread's body: the device's actions under the caller's autocast setting."""
    worker.finished.clear()
    with device_thread(worker, autocast):
        interpreter.run(worker, worker.actions, state)


@contextlib.contextmanager
def device_thread(worker: DeviceWorker, autocast):
    """What a worker thread sets up before running actions: its device, its OpenMP team, the caller's autocast."""
    if worker.device.type == "cuda":
        torch.cuda.set_device(worker.device)
    # A new thread's OpenMP team is every core until an ATen parallel region applies torch's thread
    # count, which MKL matmuls never do: without this, two CPU devices under torch.set_num_threads(1)
    # ran their matmuls on two OpenMP threads each and together went no faster than one.
    torch.set_num_threads(torch.get_num_threads())
    context = contextlib.nullcontext()
    if autocast is not None:
        # No cast cache: it keeps a low-precision copy of every fp32 weight used until the context exits,
        # here the whole step, outliving ``weights.release`` and uncounted by the budget.
        context = torch.autocast(device_type=worker.device.type, dtype=autocast, cache_enabled=False)
    with context:
        yield
