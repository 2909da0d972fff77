"""The round-robin pool's dependency rule (RoundPipe's dispatch), read from the schedule alone.

**Groups and stages.** The model's ``L`` layers are cut twice: into forward groups and into backward
groups (asymmetric splitting), and the last ``last_layers`` layers form one fused group. A stage is one
*job* (one group run over every micro-batch), numbered in execution order::

    0 .. nf-1          forward groups, first layers first:   F per micro-batch, keeps no graph
    nf                 the last group:                       F then B per micro-batch (loss fused)
    nf+1 .. nf+nb      backward groups, last layers first:   R (recompute) then B per micro-batch

``Schedule.meta`` holds the cut as integers, so text and CSV keep it: ``forward_layers`` (layer counts
of the forward groups, first layers first), ``last_layers`` (one count), ``backward_layers`` (layer
counts of the backward groups, first layers first; they run last-to-first). ``pool_groups(schedule)``
reads it back. An optional ``round_size`` (RoundPipe's rounds, ``bench/schedules/roundpipe_reference``)
makes each round's run of a stage a job of its own that may go to another device (no LOAD/STORE then).

**Events.** ``("F", j, m)``: the output of forward job j for micro-batch m (its stage inputs are kept in
host memory, so any later job may read them); ``("R", j, m)``: backward job j recomputed m;
``("G", j, m)``: the gradient w.r.t. job j's input. A backward group starting at layer ``a`` recomputes
from the activation at layer ``a``, which the forward job holding layer ``a-1`` produced; its B needs
the gradient from the job before it (the group above it, or the fused last group). Events from another
device arrive ``costs.comm`` later (through host memory). A device starts a job's micro-batch as soon
as that micro-batch's input exists, so jobs run as a wavefront.

**Costs.** Scalar fields are, as for every schedule, per rank's share: one micro-batch through ``L/p``
layers (the model split evenly over the ``p`` devices), so a job of ``n`` layers costs
``value * n * p / L``; this keeps round-robin comparable with the stage-bound schedules in ``compare``
and ``auto``. Sequence fields give one value per stage (job, in execution order) and are used as given.
F costs ``forward``, R ``recompute`` (default ``forward``), B ``backward_input + backward_weight``,
LOAD ``load`` (uploading the job's weights) and STORE ``store`` (downloading its gradients).

**Split backward.** A gradient job's B may be split into I (input gradient: produces the G event the
job below waits for) and W (weight gradient, on the same device after the I): W is off the critical
path and may fill a wait (zero-bubble's idea inside the pool). I frees ``input_grad_frees`` of the
micro-batch's activations, W the rest. The pool executor runs them (``bubbleless_runtime.pool_split``);
``roundrobin`` given ``layer_costs`` emits them where the simulator says they beat B for its plan
(``split_backward=True`` forces them, ``False`` never).

**Split jobs.** A job's micro-batches may be split over several devices (each micro-batch's actions on
one device): each of those devices LOADs the job's weights and, for a gradient job, STOREs its partial
gradients, which the host accumulators sum. The next job reads each micro-batch's events from the board
whichever device made them. This lets the job that paces the step (often the fused last group) run on
two devices at the cost of one more upload of its weights.

**Memory (in M_B).** As for the pipelines, M_B is one micro-batch's activations through ``L/p``
layers. Forward jobs keep nothing on the device (stage inputs go to host memory); R and the fused
last group's F hold ``n * p / L`` until the micro-batch's B frees it, so a device's peak is one
micro-batch of its largest backward or last group. Weights are not activations: a device holds the
weights of its current job, and of the next one while it prefetches (at most two stages); see
``held_jobs`` (per action) and ``peak_weight_layers``.

**What the simulator models of transfers.** A LOAD occupies its device for its cost, in the device's
order, so it overlaps the *wait* for the next job's first input but not the previous job's compute: a
pessimistic model of RoundPipe's prefetch, which overlaps uploads with compute on a separate stream.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

from .action import Action, Kind
from .costs import Costs
from .layouts import Event, register_layout


@dataclass(frozen=True)
class PoolGroups:
    """The forward, last and backward cut of a round-robin schedule, in layer counts."""

    forward: tuple[int, ...]
    """Layer counts of the forward groups, first layers first."""
    last: int
    """Layer count of the fused last group (forward, loss and backward)."""
    backward: tuple[int, ...]
    """Layer counts of the backward groups, first layers first (executed last-to-first)."""

    def __post_init__(self) -> None:
        if self.last < 1 or any(n < 1 for n in self.forward + self.backward):
            raise ValueError(
                f"round-robin groups need at least one layer each, got forward={list(self.forward)} "
                f"last={self.last} backward={list(self.backward)}"
            )
        if sum(self.forward) != sum(self.backward):
            raise ValueError(
                f"forward groups cover {sum(self.forward)} layers but backward groups cover {sum(self.backward)}; "
                f"both must cover every layer before the last group"
            )

    @property
    def num_layers(self) -> int:
        return sum(self.forward) + self.last

    @property
    def num_stages(self) -> int:
        return len(self.forward) + 1 + len(self.backward)

    @property
    def last_stage(self) -> int:
        """The stage (job) index of the fused last group."""
        return len(self.forward)

    def role(self, stage: int) -> str:
        """``"forward"``, ``"last"`` or ``"backward"``."""
        if not 0 <= stage < self.num_stages:
            raise ValueError(f"stage {stage} is out of range: the pool schedule has {self.num_stages} jobs")
        if stage < self.last_stage:
            return "forward"
        return "last" if stage == self.last_stage else "backward"

    def layers(self, stage: int) -> range:
        """The layers job ``stage`` runs."""
        role = self.role(stage)
        if role == "forward":
            start = sum(self.forward[:stage])
            return range(start, start + self.forward[stage])
        if role == "last":
            return range(self.num_layers - self.last, self.num_layers)
        group = len(self.backward) - (stage - self.last_stage)  # backward group index, first layers first
        start = sum(self.backward[:group])
        return range(start, start + self.backward[group])

    def forward_stage_holding(self, layer: int) -> int:
        """The forward job that runs ``layer`` (whose micro-batch outputs contain that layer's output)."""
        end = 0
        for stage, count in enumerate(self.forward):
            end += count
            if layer < end:
                return stage
        raise ValueError(f"layer {layer} is not in a forward group")

    def meta(self) -> dict[str, tuple[int, ...]]:
        return {"forward_layers": self.forward, "last_layers": (self.last,), "backward_layers": self.backward}


@lru_cache(maxsize=64)
def _groups(forward: tuple[int, ...], last: tuple[int, ...], backward: tuple[int, ...]) -> PoolGroups:
    if len(last) != 1:
        raise ValueError(f"meta.last_layers must be one layer count, got {list(last)}")
    return PoolGroups(forward, last[0], backward)



def _check_job_costs(costs: Costs, groups) -> None:
    """``costs`` per job of ``groups``; per-layer costs (one value per layer) are refused naming the
    conversion, since a pool schedule's stages are its jobs (``job_costs``), not its layers."""
    given = costs.num_stages_given()
    if given is not None and given != groups.num_stages and given == groups.num_layers:
        raise ValueError(
            f"costs give {given} per-layer values but this round-robin schedule's stages are its "
            f"{groups.num_stages} jobs: pass job_costs(layer_costs, pool_groups(schedule)) (both from "
            f"bubbleless_schedules), or generate it with layer_costs= to let the generator sum them"
        )
    costs.check_stages(groups.num_stages)

def pool_groups(schedule) -> PoolGroups:
    """Read the group cut back from a round-robin schedule's meta."""
    try:
        return _groups(schedule.meta["forward_layers"], schedule.meta["last_layers"], schedule.meta["backward_layers"])
    except KeyError as exc:
        raise ValueError(
            f"a roundrobin schedule needs meta.forward_layers, meta.last_layers and meta.backward_layers; "
            f"{exc.args[0]} is missing"
        ) from None


def held_jobs(row) -> list[tuple[int, ...]]:
    """Per action of one device's order (``schedule.actions[device]``), the jobs whose weights the device
    holds while that action runs: the pool's prefetch-and-release (``pool_worker._prefetch``).

    - A job is *open* from its first action on the device to its last, both included; its weights go
      after its last action, in whatever order the device ends its jobs (a job started later may end
      first, and its room is then free for the next job).
    - While fewer than two jobs are open, the device also holds the next job it has not started
      (the prefetch), so a job's weights are there before its first action.

    Each tuple lists the open jobs in the order the device started them, then the prefetched job if any.
    For the row ``0F0 0F1 1F0 1F1`` it is ``[(0, 1), (0, 1), (1,), (1,)]``. Only the order of the row's
    stages matters, not the action kinds. ``held_weights`` and ``peak_weight_layers`` are this rule's
    maxima; the runtime's planner and fit check count bytes with it action by action."""
    first, last = {}, {}
    for position, action in enumerate(row):
        first.setdefault(action.stage, position)
        last[action.stage] = position
    starts = sorted(first, key=first.__getitem__)  # the device's jobs in the order it starts them
    held, open_jobs, started, now = [], [], 0, ()
    for position, action in enumerate(row):
        if first[action.stage] == position:
            open_jobs.append(action.stage)
            started += 1
            now = _holding(open_jobs, starts[started:started + 1])
        held.append(now)
        if last[action.stage] == position:  # only a job's first and last actions change what is held
            open_jobs.remove(action.stage)
            now = _holding(open_jobs, starts[started:started + 1])
    return held


def _holding(open_jobs: list[int], unstarted: list[int]) -> tuple[int, ...]:
    """The open jobs, and the next unstarted one while fewer than two are open (``held_jobs``)."""
    return tuple(open_jobs + unstarted) if len(open_jobs) < 2 else tuple(open_jobs)


def peak_weight_layers(schedule) -> tuple[int, ...]:
    """Per device, the most layers of weights resident at once under the pool's rule (``held_jobs``):
    with every job ending in the order it started, two consecutive jobs."""
    size = _job_layers(schedule)
    return tuple(_held_on_device(row, size)[1] for row in schedule.actions)


def held_weights(schedule) -> tuple[int, int]:
    """(most jobs open at once, most layers of weights held at once) on any device, under the pool's
    rule (``held_jobs``): a job's weights arrive at its first action, or earlier as the prefetch of the
    device's next unstarted job while fewer than two jobs are open, and go after its last action, in
    whatever order the device ends its jobs. More than two open jobs means the pool would load a third (and
    ``steady_state(load_stream=True)`` would deadlock), so the generator refuses such an order."""
    size = _job_layers(schedule)
    held = [_held_on_device(row, size) for row in schedule.actions]
    return max((jobs for jobs, _ in held), default=0), max((layers for _, layers in held), default=0)


def _job_layers(schedule) -> dict[int, int]:
    groups = pool_groups(schedule)
    return {job: len(groups.layers(job)) for job in range(groups.num_stages)}


def _held_on_device(row, size: dict[int, int]) -> tuple[int, int]:
    """(most jobs open, most layers held) at once in one device's order (``held_jobs``): the prefetched
    job is the one in a tuple not yet started at that action, so it counts in the layers, not the jobs."""
    begun, most_jobs, most_layers, before = set(), 0, 0, None
    for action, jobs in zip(row, held_jobs(row), strict=True):
        if jobs == before and action.stage in begun:
            continue  # held as at the action before (the search asks this of every candidate: skip the sums)
        begun.add(action.stage)
        before = jobs
        most_jobs = max(most_jobs, sum(job in begun for job in jobs))
        most_layers = max(most_layers, sum(size[job] for job in jobs))
    return most_jobs, most_layers


_ROLE_KINDS = {"forward": (Kind.F,), "last": (Kind.F, Kind.B), "backward": (Kind.R, Kind.B)}
"""The compute actions each micro-batch of a job needs, by the job's role."""


@register_layout("roundrobin")
class RoundRobinLayout:
    """Dependencies, costs and memory of a round-robin pool schedule (see the module docstring)."""

    def requires(self, action: Action, schedule) -> tuple[Event, ...]:
        return _requires(action, pool_groups(schedule))

    def rule_rows(self, schedule, costs: Costs) -> tuple[list, list, list]:
        """``requires``, ``produces`` and ``cost`` of every action, row by row, with the cut read from the
        meta once and each kind and stage's cost asked once (the per-action methods read the cut per call,
        which dominated simulating the search's large candidates); the same values as the methods."""
        groups = pool_groups(schedule)
        if any(schedule.actions):  # as ``cost`` checks them, once per action
            _check_job_costs(costs, groups)
        requires, produces, durations, per_kind_stage = [], [], [], {}
        for row in schedule.actions:
            requires.append([_requires(a, groups) for a in row])
            produces.append([self.produces(a, schedule) for a in row])
            takes = []
            for a in row:
                key = (a.kind, a.stage)
                cost = per_kind_stage.get(key)
                if cost is None:
                    cost = per_kind_stage[key] = _cost(a, groups, schedule.num_workers, costs)
                takes.append(cost)
            durations.append(takes)
        return requires, produces, durations
    def produces(self, action: Action, schedule) -> tuple[Event, ...]:
        j, m, kind = action.stage, action.microbatch, action.kind
        if kind in (Kind.LOAD, Kind.STORE):  # no event: a split job has one LOAD/STORE per device
            return ()
        if kind is Kind.I:
            return (("G", j, m), ("I", j, m))
        return (({Kind.F: "F", Kind.R: "R", Kind.B: "G", Kind.W: "W"}[kind], j, m),)

    def memory_delta(self, action: Action, schedule, input_grad_frees: float) -> float:
        groups = pool_groups(schedule)
        held = len(groups.layers(action.stage)) * schedule.num_workers / groups.num_layers
        if action.kind is Kind.R or (action.kind is Kind.F and groups.role(action.stage) == "last"):
            return held
        if action.kind is Kind.I:
            return -held * input_grad_frees
        if action.kind is Kind.W:
            return -held * (1.0 - input_grad_frees)
        return -held if action.kind is Kind.B else 0.0

    def memory_rows(self, schedule, input_grad_frees: float) -> list[list[float]]:
        """``memory_delta`` of every action, row by row, with the group sizes read once (the search asks
        for the peak of every candidate it keeps); the same values, one lookup per action."""
        groups = pool_groups(schedule)
        held = [len(groups.layers(j)) * schedule.num_workers / groups.num_layers for j in range(groups.num_stages)]
        last = groups.last_stage
        deltas = {Kind.R: 1.0, Kind.B: -1.0, Kind.I: -input_grad_frees, Kind.W: -(1.0 - input_grad_frees)}
        rows = []
        for row in schedule.actions:
            out = []
            for action in row:
                kind, stage = action.kind, action.stage
                if kind is Kind.F:
                    out.append(held[stage] if stage == last else 0.0)
                elif kind in deltas:
                    out.append(held[stage] * deltas[kind])
                else:
                    out.append(0.0)
            rows.append(out)
        return rows

    def cost(self, action: Action, schedule, costs: Costs) -> float:
        groups = pool_groups(schedule)
        _check_job_costs(costs, groups)
        return _cost(action, groups, schedule.num_workers, costs)

    def missing(self, schedule) -> list[str]:
        """Each job's role's actions once per micro-batch, each micro-batch's actions on one device (a
        job's micro-batches may be split over devices); LOAD/STORE either absent everywhere, or on each
        device running part of a job one LOAD before its part and one STORE after it (gradient jobs)."""
        try:
            groups = pool_groups(schedule)
        except ValueError as exc:
            return [str(exc)]
        if groups.num_stages != schedule.num_stages:
            return [f"meta describes {groups.num_stages} jobs but the schedule has {schedule.num_stages} stages"]
        problems = []
        counts = Counter((a.stage, a.kind, a.microbatch) for _, _, a in schedule.all_actions())  # plain keys: fast
        devices = defaultdict(set)  # (job, micro-batch) -> the devices running its compute actions
        for worker, _, action in schedule.all_actions():
            devices[(action.stage, action.microbatch)].add(worker)
            if action.stage < groups.num_stages and _meaningless(action, groups.role(action.stage)):
                problems.append(_meaningless(action, groups.role(action.stage)))
        transfers = any(kind in (Kind.LOAD, Kind.STORE) for _, kind, _ in counts)
        round_size = round_size_of(schedule)
        if round_size is not None:
            return problems + _round_problems(schedule, groups, round_size, transfers, counts)
        kinds = defaultdict(dict)  # job -> device -> the kinds of its actions there, in order (read once)
        for worker, actions in enumerate(schedule.actions):
            for action in actions:
                kinds[action.stage].setdefault(worker, []).append(action.kind)
        for j in range(groups.num_stages):
            role = groups.role(j)
            for m in range(schedule.num_microbatches):
                problems += _compute_problems(j, role, m, counts)
                where = devices.get((j, m), set())
                if len(where) > 1:
                    problems.append(
                        f"micro-batch {m} of {role} job {j} runs on devices {sorted(where)}; a job's micro-batches "
                        f"may be split over devices, but each micro-batch's actions run on one device"
                    )
            if transfers:
                problems += _transfer_problems(kinds.get(j, {}), j, role)
        return problems


def _requires(action: Action, groups: PoolGroups) -> tuple[Event, ...]:
    """``RoundRobinLayout.requires`` with the cut given."""
    j, m, kind = action.stage, action.microbatch, action.kind
    role = groups.role(j)
    problem = _meaningless(action, role)
    if problem:
        raise ValueError(problem)
    if kind in (Kind.LOAD, Kind.STORE):  # a STORE follows the job's B/W on its device in the device's order
        return ()
    if kind is Kind.F:
        return (("F", j - 1, m),) if j > 0 else ()
    if kind is Kind.R:
        first = groups.layers(j).start
        return (("F", groups.forward_stage_holding(first - 1), m),) if first > 0 else ()
    if kind is Kind.W:  # the weight half of a split backward, after its input half on the same device
        return (("I", j, m),)
    if role == "last":  # B (or I) of the fused last group
        return (("F", j, m),)
    return (("R", j, m), ("G", j - 1, m))


def _cost(action: Action, groups: PoolGroups, num_workers: int, costs: Costs) -> float:
    """``RoundRobinLayout.cost`` with the cut given (the caller checks ``costs``' stage count)."""
    # Costs.of divides scalars by its third argument; p/(n p / L) = L/n makes a scalar value * n p / L.
    share = groups.num_layers / (len(groups.layers(action.stage)) * num_workers)
    if action.kind in (Kind.LOAD, Kind.STORE):
        name = "load" if action.kind is Kind.LOAD else "store"
        value = getattr(costs, name)
        return value[action.stage] if isinstance(value, tuple) else float(value) / share
    return costs.of(action.kind, action.stage, share)


def round_size_of(schedule) -> int | None:
    """``meta.round_size``: micro-batches per round when a stage's jobs are dealt per round (RoundPipe
    dispatches rounds of up to N micro-batches, each round's run of a stage a job of its own)."""
    value = schedule.meta.get("round_size")
    if value is None:
        return None
    if len(value) != 1 or value[0] < 1:
        raise ValueError(f"meta.round_size must be one integer >= 1, got {list(value)}")
    return value[0]


def _round_problems(schedule, groups: PoolGroups, round_size: int, transfers: bool, counts: Counter) -> list[str]:
    """With rounds, a job is (stage, round): each on one device, every micro-batch's actions once."""
    if transfers:
        return ["LOAD/STORE are not modelled per round: generate a schedule with meta.round_size without them"]
    problems, devices = [], defaultdict(set)
    for worker, _, action in schedule.all_actions():
        if action.microbatch is not None:
            devices[(action.stage, action.microbatch // round_size)].add(worker)
    for (j, r), where in sorted(devices.items()):
        if len(where) > 1:
            problems.append(f"job {j} of round {r} runs on devices {sorted(where)}; a job runs on one device")
    for j in range(groups.num_stages):
        role = groups.role(j)
        for m in range(schedule.num_microbatches):
            problems += _compute_problems(j, role, m, counts)
    return problems


def _compute_problems(j: int, role: str, m: int, counts: Counter) -> list[str]:
    """Each of the role's actions once for micro-batch m (``counts``: (stage, kind, micro-batch) -> how
    often the schedule has it); a gradient job's B may instead be split into I then W (both once, on the
    device that ran the I)."""
    problems = []
    for kind in _ROLE_KINDS[role]:
        if kind is Kind.B and counts[(j, Kind.B, m)] == 0 and counts[(j, Kind.I, m)] == 1 \
                and counts[(j, Kind.W, m)] == 1:
            continue
        split = kind is Kind.B and (counts[(j, Kind.I, m)] or counts[(j, Kind.W, m)])
        have = counts[(j, kind, m)]
        if have != 1 or split:
            problems.append(f"{role} job {j} has {have} of {Action(j, kind, m)}, needs 1"
                            + (" (or I and W once each instead)" if kind is Kind.B else "")
                            + (f": micro-batch {m} of job {j} is on no device" if have == 0 and not split else ""))
    return problems


def _meaningless(action: Action, role: str) -> str | None:
    if action.kind in _ROLE_KINDS[role] or action.kind in (Kind.LOAD, Kind.STORE):
        return None
    if action.kind in (Kind.I, Kind.W) and role != "forward":
        return None
    return (
        f"action {action} has no meaning in a round-robin pool: a {role} job runs "
        f"{' and '.join(k.value for k in _ROLE_KINDS[role])} per micro-batch, plus LOAD/STORE"
    )


def _transfer_problems(kinds_on: dict[int, list[Kind]], stage: int, role: str) -> list[str]:
    """On every device running part of the job (``kinds_on``: device -> the kinds of the job's actions
    there, in order, devices ascending): LOAD first and (for gradient jobs) STORE last among them (a job
    split over devices uploads its weights and stores its gradients on each)."""
    problems = []
    wants_store = role != "forward"
    for device, mine in kinds_on.items():
        if mine[0] is not Kind.LOAD or mine.count(Kind.LOAD) != 1:
            problems.append(f"job {stage} needs exactly one LOAD on device {device}, before its first micro-batch there")
        if wants_store and (mine[-1] is not Kind.STORE or mine.count(Kind.STORE) != 1):
            problems.append(f"{role} job {stage} needs exactly one STORE on device {device}, after its last "
                            "micro-batch there")
        if not wants_store and Kind.STORE in mine:
            problems.append(f"forward job {stage} computes no gradients and takes no STORE")
    return problems
