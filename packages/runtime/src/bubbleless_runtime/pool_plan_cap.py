"""A round-robin plan's bytes per device, from a profile, and the layer-cost generator held to a cap.

``auto_groups``' ``memory_cap`` is ``cut()``'s rule: bytes per group, a group's training state and one
micro-batch's activations (``Profile.layer_memory``). A device holds two consecutive jobs (the current
and the prefetched), so a device within the cut's rule holds at most ``2 x memory_cap``: that is the
budget the layer-cost generator's plan is held to, counted by ``plan_peak_bytes``.

``plan_peak_bytes`` walks each device's actions in the order the device runs them:

- weights: the pool's rule (``bubbleless_schedules.roundrobin_layout.held_weights``, what
  ``pool_worker._prefetch`` does): a device holds a job's weights from its first action there to its
  last, and the weights of its next job not yet started while fewer than two jobs are open, in whatever
  order it ends them (``held_jobs``: a job started later may end first, and its room then takes the
  next job). A job split over devices holds its weights on each of them.
  A job's weights are its layers' ``param_bytes`` times ``Profile.state_bytes_per_param_byte``.
- micro-batches: a gradient job's R (the fused last group's F) keeps its layers'
  ``activation_bytes_per_token`` times ``tokens_per_microbatch``, its uploaded input (in full), and the
  larger of the input gradient it hands down and the output gradient its B uploads
  (``held_microbatch_bytes``) until that micro-batch's B, or its I when B is split into I and W; from I
  to W it holds what the deferred weight gradients keep (``kept_until_w_bytes``: each deferred linear's
  input and output gradient, measured by ``pool_kept``; a profile without that figure holds the R-to-I
  bytes until W). Recomputing ahead (two micro-batches, or the next job's in the current
  job's waits) holds them all. Forward jobs keep nothing past an action, but each F holds its uploaded
  input while it runs (``forward_input_bytes``).
- layer 0's input: the caller's micro-batch, which a GPU worker copies to its device and counts (a CPU
  worker reads it where it is), ``input_bytes`` of it (0 by default: a profile does not give it).

The pool's own fit check (``pool_memory.check_fits``) walks the same way (``device_peak_walk``), with
the weights' bytes as the host store holds them, so a plan held to a budget here passes it. What no
layer owns (a loss chunk when the profile leaves it out) is the caller's to take off the cap first.
"""

from __future__ import annotations

from dataclasses import dataclass

from bubbleless_partition import Profile
from bubbleless_schedules import Schedule, generate
from bubbleless_schedules.action import Kind
from bubbleless_schedules.roundrobin_layout import held_jobs, peak_weight_layers, pool_groups

from .pool_kept import KEPT_UNTIL_W


def plan_peak_bytes(schedule: Schedule, profile: Profile, input_bytes: float = 0.0) -> tuple[float, ...]:
    """Per device, the most bytes of weights and held micro-batches it holds at once (module docstring);
    ``input_bytes``: what a worker holds of one micro-batch of the caller's input (0 on CPU devices)."""
    groups = pool_groups(schedule)
    if groups.num_layers != profile.num_layers:
        raise ValueError(f"the schedule cuts {groups.num_layers} layers but the profile has {profile.num_layers}")
    weights = [sum(profile.layers[i].param_bytes for i in groups.layers(j)) * profile.state_bytes_per_param_byte
               for j in range(groups.num_stages)]
    held = [held_microbatch_bytes(groups, j, profile, input_bytes) for j in range(groups.num_stages)]
    passing = [forward_input_bytes(groups, j, profile, input_bytes) for j in range(groups.num_stages)]
    kept = [kept_until_w_bytes(groups, j, profile) for j in range(groups.num_stages)]
    return tuple(peak.bytes for peak in device_peak_walk(schedule, weights, held, passing, kept))


def kept_until_w_bytes(groups, job: int, profile: Profile | None) -> float | None:
    """One micro-batch of gradient job ``job`` from its I to its W (a split backward): what its deferred
    weight gradients keep, the sum of its layers' ``Profile.extra[KEPT_UNTIL_W]`` (``pool_kept``: each
    deferred linear's input and output gradient ``g``, the job's uploaded input and received gradient
    among them where W keeps them) times the tokens. The model's last layer runs outside the deferral
    (``pool_worker``: its I computes its weight gradient) and keeps nothing. None without that entry:
    the walk then holds the R-to-I bytes (``held_microbatch_bytes``) until W."""
    per_token = None if profile is None else profile.extra.get(KEPT_UNTIL_W)
    if per_token is None or groups.role(job) == "forward":
        return None
    if len(per_token) != profile.num_layers:
        raise ValueError(f"Profile.extra[{KEPT_UNTIL_W!r}] has {len(per_token)} entries for {profile.num_layers} "
                         "layers: drop the entry (the plan then counts without it) or profile the model again")
    deferred = [i for i in groups.layers(job) if i < profile.num_layers - 1]
    return sum(per_token[i] for i in deferred) * profile.tokens_per_microbatch


def held_microbatch_bytes(groups, job: int, profile: Profile | None, input_bytes: float = 0.0) -> float:
    """One micro-batch of gradient job ``job`` from its R (the fused group's F) to its backward: its
    uploaded input, what autograd saves through the group, and the larger of the input gradient it hands
    down and the output gradient its B uploads (a backward job's; the last group's starts at the loss), as
    the executor counts them (``pool_worker``: the upload reserved in full, then every other storage
    saved, then the output gradient's upload). A job at layer 0 uploads ``input_bytes`` of the caller's
    micro-batch (a GPU worker's copy) and hands no gradient down, but its B still takes the gradient of
    its output: without that, a layer-0 job whose layers save little (an embedding) was counted under
    what it reserves. A profile's saved bytes hold a layer's input where the layer saves it (a norm that
    keeps its input) and not where it saves something else (an RMSNorm keeping its float32 copy of a bf16
    input, a tanh its output); a profile does not say which, so the upload is counted in full beside them:
    exact for the second kind, one boundary over for the first, never under. Forward jobs keep nothing;
    without a profile nothing is known (0)."""
    if profile is None or groups.role(job) == "forward":
        return 0.0
    tokens = profile.tokens_per_microbatch
    layers = groups.layers(job)
    saved = sum(profile.layers[i].activation_bytes_per_token for i in layers) * tokens
    boundary = profile.layers[layers.start - 1].output_bytes_per_token * tokens if layers.start > 0 else 0.0
    upload = boundary if layers.start > 0 else input_bytes
    received = profile.layers[layers.stop - 1].output_bytes_per_token * tokens if groups.role(job) == "backward" else 0.0
    return saved + upload + max(boundary, received)


def forward_input_bytes(groups, job: int, profile: Profile | None, input_bytes: float = 0.0) -> float:
    """What a forward job's F holds while it runs and frees after: its uploaded input (``pool_worker``
    reserves it for the F), at layer 0 ``input_bytes`` of the caller's micro-batch (a GPU worker's copy; 0
    on a CPU device, which reads it where it is). Other jobs' F keep a graph and are counted by
    ``held_microbatch_bytes``; without a profile nothing is known (0)."""
    layers = groups.layers(job)
    if profile is None or groups.role(job) != "forward":
        return 0.0
    if layers.start == 0:
        return input_bytes
    return profile.layers[layers.start - 1].output_bytes_per_token * profile.tokens_per_microbatch


@dataclass(frozen=True)
class DevicePeak:
    """A device's peak: its bytes, the jobs whose weights it holds then, the (job, micro-batch) pairs held
    and their bytes, and the input a forward job's F holds then (``forward_input_bytes``)."""

    bytes: float
    jobs: tuple[int, ...] = ()
    microbatches: tuple[tuple[int, int], ...] = ()
    passing: float = 0.0
    held: float = 0.0


def device_peak_walk(schedule: Schedule, weights, held_bytes, passing_bytes=None,
                     kept_bytes=None) -> list[DevicePeak]:
    """Per device, the peak of the walk over its actions (module docstring): ``weights[job]`` bytes for
    each job whose weights it holds (``held_jobs``), ``held_bytes[job]`` for each micro-batch of it held
    from R (the fused group's F) to B or W, ``passing_bytes[job]`` (default none) during each F of a
    forward job (``forward_input_bytes``), and from its I to its W ``kept_bytes[job]`` instead where that is
    not None (``kept_until_w_bytes``; I's own peak still holds ``held_bytes``). The one estimator of ``plan_peak_bytes`` and the pool's fit
    check (``pool_memory``)."""
    groups = pool_groups(schedule)
    peaks = []
    for row in schedule.actions:
        held, worst = {}, DevicePeak(0.0)
        for action, resident in zip(row, held_jobs(row), strict=True):
            key = (action.stage, action.microbatch)
            if action.kind is Kind.R or (action.kind is Kind.F and groups.role(action.stage) == "last"):
                held[key] = held_bytes[action.stage]
            passing = 0.0 if passing_bytes is None or action.kind is not Kind.F else passing_bytes[action.stage]
            total = sum(weights[j] for j in resident) + sum(held.values()) + passing
            if total > worst.bytes:
                worst = DevicePeak(total, resident, tuple(held), passing, sum(held.values()))
            if action.kind in (Kind.B, Kind.W):
                held.pop(key, None)
            elif action.kind is Kind.I and key in held and kept_bytes is not None and kept_bytes[action.stage] is not None:
                held[key] = kept_bytes[action.stage]
        peaks.append(worst)
    return peaks


def fits(schedule: Schedule, profile: Profile, device_budget: float | None, input_bytes: float = 0.0) -> bool:
    """Whether no device of ``schedule`` holds more than ``device_budget`` bytes (None: any plan fits)."""
    return device_budget is None or \
        max(plan_peak_bytes(schedule, profile, input_bytes)) <= device_budget * (1 + 1e-12)


LEANER = ({"recompute_ahead": 1}, {"split_backward": False}, {"split_backward": False, "recompute_ahead": 1})
"""Dispatch options that hold fewer activations, tried when the generator's own choice is over the
budget: one micro-batch recomputed ahead only (not two, nor the next job's in the current job's waits),
no W deferred past its I, and both."""


def generated_within(profile: Profile, device_budget: float | None, *, layer_costs, num_devices: int,
                     num_microbatches: int, options: dict, input_bytes: float = 0.0,
                     asked: AskedOnce | None = None) -> list[Schedule]:
    """Plans of ``generate("roundrobin", layer_costs=...)`` that keep every device within ``device_budget``
    bytes (``plan_peak_bytes``); the caller simulates them and keeps the fastest. With ``weight_limit`` in
    ``options``, the generator's own plan (none if over the budget; its ValueErrors propagate). Without a
    budget (None), the candidates of a budget every layer fits in, all fitting (the generator's own
    ValueErrors propagate): a user who gives none gets a plan at least as fast as under any budget. The
    pool promises nothing leaner without one (``MemoryBudget(None)`` only counts; the DP cuts are cut
    without a cap), and the generator's own plan alone was slower than a budget's on the tiny bench
    scenario (6 decoder layers, 2 CPU devices, 8 micro-batches: 423 ms simulated against 359 ms).
    Otherwise each that fits of:

    - the generator's own plan (its default weight limit: what its best unsplit plan holds);
    - with ``weight_limit`` the most layers whose weights alone could fit (``most_layers_within``): the
      generator's own dispatch, and unless that fits each ``LEANER`` one the options leave free;
    - for each of those dispatches over the budget there, the plan of the largest smaller limit that
      fits (``largest_fitting`` from the most layers it held); and when no dispatch fits at the most
      layers, the leanest one's from below the fewest layers any of them held.

    The generator's search is a heuristic, monotone neither in the limit nor in the dispatch: a wider
    limit can land a slower plan (8x A800 Qwen3-1.7B, measured at 5d04131: 847 ms with 30 layers, 769 ms
    at its own 15), and a fuller dispatch at a smaller limit can beat the leanest at the widest (8x RTX
    4090 Llama-3.1-8B: 6,002 ms against 6,096), so the simulator judges every one of them. The last
    item is the one candidate there was before the others: the list is never without it.

    ``asked``: the generator's answers so far (``generator_asked`` of the same costs and pool), shared by
    the searches of one plan; default a fresh one."""
    asked = generator_asked(layer_costs, num_devices, num_microbatches) if asked is None else asked

    def attempt(**extra) -> Schedule | None:
        return _plan_or_none(asked, {**options, **extra})

    def fitting(schedule: Schedule) -> bool:
        return fits(schedule, profile, device_budget, input_bytes)

    if "weight_limit" in options:  # the options' own errors are the caller's
        schedule = asked(**options)
        return [schedule] if fitting(schedule) else []
    most = profile.num_layers if device_budget is None else most_layers_within(profile, device_budget)
    if most < 1:
        return []
    own = asked(**options) if device_budget is None else attempt()  # no budget: its errors are the caller's
    found = [own] if own is not None and fitting(own) else []
    variants = [{}] + [lean for lean in LEANER if not set(lean) & set(options)]
    over, tried, any_fits = [], {}, False
    for variant in variants:
        if _runs_b_whole_already(variant, tried):
            continue
        widest = attempt(weight_limit=most, **variant)
        if widest is None:
            break
        tried[tuple(sorted(variant.items()))] = widest
        if fitting(widest):
            found.append(widest)
            any_fits = True
            if not variant:
                break  # the generator's own dispatch fits: the leaner ones are no faster by its judgement
        else:
            over.append((variant, min(most, max(peak_weight_layers(widest))) - 1))
    starts = over + ([] if any_fits or not over else [(variants[-1], min(high for _, high in over))])
    for variant, high in starts:
        lower = largest_fitting(lambda limit, v=variant: attempt(weight_limit=limit, **v), fitting, high)
        if lower is not None:
            found.append(lower)
    return list({schedule.to_text(): schedule for schedule in found}.values())


def leanest_generated(profile: Profile, *, layer_costs, num_devices: int, num_microbatches: int, options: dict,
                      input_bytes: float = 0.0, asked: AskedOnce | None = None) -> list[tuple[float, str]]:
    """For a refusal (``pool_plan_refusal``): (peak bytes on the fullest device, what plan) of the generator's
    own plan and, for its own dispatch and each ``LEANER`` one the options leave free, its leanest plans:
    those of the smallest ``weight_limit`` it plans at (``smallest_planned``) and the limits above it while
    the peak keeps falling. Not only the smallest limit's: the generator is monotone neither in the limit
    nor in the dispatch (the tiny test profile, split_backward=False: 99,840 bytes at weight_limit=2,
    149,760 at 3, 102,144 at 5). Every limit of every dispatch was asked for before: 128 searches, 140 s
    on a 32-layer profile over 4 devices at 16 micro-batches, where planning took 1.4-2.5 s; a few a
    dispatch now (about 2 log2 layers + ``FALLING_STEPS``), and none for a dispatch without W of
    its own (``split_backward=False`` gives the same plans there). ``asked``: as ``generated_within``'s."""
    asked = generator_asked(layer_costs, num_devices, num_microbatches) if asked is None else asked

    def peak(schedule: Schedule) -> float:
        return max(plan_peak_bytes(schedule, profile, input_bytes))

    def plan(**extra) -> Schedule | None:
        return _plan_or_none(asked, {**options, **extra})

    found = []
    own = plan()
    if own is not None:
        found.append((peak(own), "the layer-cost generator's own plan"))
    if "weight_limit" in options:
        return found
    seen = set() if own is None else {own.to_text()}
    leanest: dict = {}
    for variant in [{}] + [lean for lean in LEANER if not set(lean) & set(options)]:
        if _runs_b_whole_already(variant, leanest):
            continue
        plans = falling_from_smallest(lambda at, v=variant: plan(weight_limit=at, **v), peak, profile.num_layers)
        if plans:
            leanest[tuple(sorted(variant.items()))] = plans[0][1]
        for limit, schedule in plans:
            if schedule.to_text() in seen:
                continue
            seen.add(schedule.to_text())
            named = ", ".join(f"{k}={v!r}" for k, v in {"weight_limit": limit, **variant}.items())
            found.append((peak(schedule), f"the layer-cost generator's plan with {named}"))
    return found


class AskedOnce:
    """A generator asked each question once: ``asked(**options)`` calls ``ask(**options)`` the first time
    and gives its schedule again (or raises its ValueError again) for the same options after. The searches of
    one plan ask many of the same (the refusal's re-searches under larger budgets and its leanest plans: 24
    of 51 generator searches on the tiny test profile's refusal). ``ask`` must be a pure function of the
    options (the generators are), so an answer kept is the answer it would give."""

    def __init__(self, ask) -> None:
        self._ask = ask
        self._answers: dict = {}

    def __call__(self, **options) -> Schedule:
        key = repr(sorted(options.items()))  # repr: an option's value need not be hashable (a list)
        if key not in self._answers:
            try:
                self._answers[key] = self._ask(**options)
            except ValueError as error:
                self._answers[key] = error
        answer = self._answers[key]
        if isinstance(answer, ValueError):
            raise answer.with_traceback(None)
        return answer


def generator_asked(layer_costs, num_devices: int, num_microbatches: int,
                    objective: str = "makespan") -> AskedOnce:
    """``generate("roundrobin", layer_costs=..., objective=...)`` on this pool, each set of options asked once."""
    return AskedOnce(lambda **options: generate("roundrobin", num_ranks=num_devices, num_microbatches=num_microbatches,
                                                layer_costs=layer_costs, objective=objective, **options))


def _plan_or_none(asked: AskedOnce, options: dict) -> Schedule | None:
    """The layer-cost generator's plan with ``options``; None when no cut keeps within their weight limit (a
    smaller limit finds none either)."""
    try:
        return asked(**options)
    except ValueError:
        return None


def _runs_b_whole_already(variant: dict, tried: dict) -> bool:
    """Whether ``variant`` only adds ``split_backward=False`` to a dispatch already tried (``tried``: sorted
    option items -> its plan) whose plan runs every B whole: the generator would give the same plans."""
    if "split_backward" not in variant:
        return False
    same = tried.get(tuple(sorted((k, v) for k, v in variant.items() if k != "split_backward")))
    return same is not None and not _splits_backward(same)


FALLING_STEPS = 3
"""Limits above the smallest planned one ``falling_from_smallest`` asks for at most."""


def falling_from_smallest(plan_at, peak, most: int) -> list[tuple[int, Schedule]]:
    """(limit, plan) of the smallest limit ``plan_at`` plans at (``smallest_planned``) and of each next
    limit while its plan's ``peak`` does not rise, ``FALLING_STEPS`` at most: the leanest plans sit at the fewest
    layers a device may hold, where a layer more can still hold less (a cut the dispatch suits better)."""
    smallest = smallest_planned(plan_at, most)
    if smallest is None:
        return []
    limit, schedule = smallest
    found = [smallest]
    for above in range(limit + 1, min(limit + FALLING_STEPS, most) + 1):
        upper = plan_at(above)
        if upper is None or peak(upper) > peak(schedule):
            break
        found.append((above, upper))
        schedule = upper
    return found


def smallest_planned(plan_at, most: int) -> tuple[int, Schedule] | None:
    """(limit, plan) of the smallest limit in 1 .. ``most`` that ``plan_at`` gives a plan for (None below
    it, and then below any smaller one): up from 1 in doubling limits, then a bisection under the first."""
    refused, limit = 0, 1
    planned = None
    while limit <= most:
        planned = plan_at(limit)
        if planned is not None:
            break
        refused, limit = limit, min(2 * limit, most) if limit < most else most + 1
    if planned is None:
        return None
    low, top = refused + 1, limit - 1
    while low <= top:
        middle = (low + top) // 2
        schedule = plan_at(middle)
        if schedule is None:
            low = middle + 1
        else:
            limit, planned, top = middle, schedule, middle - 1
    return limit, planned


def largest_fitting(plan_at, fitting, high: int):
    """The plan of the largest weight limit <= ``high`` that is ``fitting`` (nearly monotone in the limit):
    down from ``high`` in doubling steps (a plan just over the budget usually fits a layer or two lower),
    then a bisection above where that stopped, below the last limit over the budget. ``plan_at`` gives
    None when no cut keeps within a limit (nor, then, within a smaller one)."""
    best, over, step, limit = None, high + 1, 1, high
    while limit >= 1:
        schedule = plan_at(limit)
        if schedule is None:
            break
        if fitting(schedule):
            best = schedule
            break
        over, limit, step = limit, limit - step, 2 * step
    low, top = max(limit, 0) + 1, over - 1
    while low <= top:
        middle = (low + top) // 2
        schedule = plan_at(middle)
        if schedule is None or fitting(schedule):
            best, low = best if schedule is None else schedule, middle + 1
        else:
            top = middle - 1
    return best


def most_layers_within(profile: Profile, device_budget: float) -> int:
    """The most layers whose weights (the lightest ones) fit ``device_budget``: no device of a plan that
    fits holds more, so a larger ``weight_limit`` only admits plans over the budget."""
    held, count = 0.0, 0
    for size in sorted(layer.param_bytes * profile.state_bytes_per_param_byte for layer in profile.layers):
        held += size
        if held > device_budget:
            break
        count += 1
    return count


def _splits_backward(schedule: Schedule) -> bool:
    return any(a.kind is Kind.W for row in schedule.actions for a in row)
