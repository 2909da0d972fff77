"""Generators register by name; ``generate`` looks them up, checks the input and the result.

A generator is a pure function::

    @register("my-schedule", "alias")
    def my_schedule(*, num_ranks, num_microbatches, costs, memory_limit, **options) -> Schedule: ...

``costs`` is always a ``Costs`` (unit costs when the caller gave none); ``memory_limit`` is in M_B or
None. A generator raises ``ValueError`` naming the constraint for shapes it cannot support. After it
returns, ``generate`` checks that it returned a ``Schedule`` of the shape asked (``_check_result``), validates
it and checks the memory limit, so no generator repeats that.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

from .costs import Costs
from .schedule import Schedule
from .simulate import check_costs, peak_memory, simulated_makespan
from .validate import validate

Generator = Callable[..., Schedule]
_GENERATORS: dict[str, Generator] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, *aliases: str) -> Callable[[Generator], Generator]:
    """Decorator: make a generator available to ``generate(name)`` (and under each alias).

    The built-ins are loaded first, so a name they hold is refused here, at the caller's decorator; loaded
    later, the collision would stop their import half-way and leave the registry without the rest of them.
    """
    _load_builtin()  # a no-op while the built-ins load (they register through here): see _load_builtin

    def wrap(fn: Generator) -> Generator:
        for key in (name, *aliases):
            if key in _GENERATORS or key in _ALIASES:
                raise ValueError(f"a schedule named {key!r} is already registered")
        _GENERATORS[name] = fn
        for alias in aliases:
            _ALIASES[alias] = name
        return fn

    return wrap


def available() -> list[str]:
    """Registered schedule names (aliases not included), in registration order."""
    _load_builtin()
    return list(_GENERATORS)


def aliases() -> dict[str, str]:
    _load_builtin()
    return dict(_ALIASES)


def generator(name: str) -> Generator:
    """The function registered under ``name`` (or an alias of it)."""
    return _GENERATORS[canonical_name(name)]


def canonical_name(name: str) -> str:
    _load_builtin()
    name = _ALIASES.get(name, name)
    if name not in _GENERATORS:
        raise ValueError(
            f"unknown schedule {name!r}; choose one of {', '.join(available())} "
            f"(aliases: {', '.join(f'{a}={n}' for a, n in _ALIASES.items())})"
        )
    return name


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def generate(
    name: str,
    *,
    num_ranks: int,
    num_microbatches: int,
    costs: Costs | None = None,
    memory_limit: float | None = None,
    validated: bool = True,
    **options,
) -> Schedule:
    """Build the schedule ``name`` for ``num_ranks`` ranks and ``num_microbatches`` micro-batches.

    ``costs`` (default: unit costs) steer cost-aware generators; ``memory_limit`` (in M_B, the
    activations of one micro-batch on one rank's share) bounds every rank's peak (``inf`` or None: no
    limit). Raises ``ValueError`` saying what to change when the name is unknown, the shape is unsupported or the limit cannot be met.
    ``validated=False`` skips the validator, for a caller that simulates the result anyway (which raises
    on a deadlock or a missing action) and validates the one it keeps, as ``auto`` does.
    """
    name = canonical_name(name)
    fn = _GENERATORS[name]
    _check_int("num_ranks", num_ranks, 1)
    _check_int("num_microbatches", num_microbatches, 1)
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not memory_limit > 0
    ):
        raise ValueError(f"memory_limit is in M_B and must be a positive number (inf or None: no limit), got "
                         f"{memory_limit!r}")
    if memory_limit == math.inf:
        memory_limit = None  # no limit; generators do arithmetic on a finite one
    costs = Costs.unit() if costs is None else costs
    check_costs(costs)
    input_grad_frees = options.get("input_grad_frees", 0.0)
    if not isinstance(input_grad_frees, (int, float)) or not 0.0 <= input_grad_frees <= 1.0:
        raise ValueError(f"input_grad_frees is a fraction within [0, 1], got {input_grad_frees!r}")
    options = _options_for(fn, name, options)

    def build(steering: Costs) -> Schedule:
        return (validate if validated else _as_is)(_check_result(name, fn(
            num_ranks=num_ranks, num_microbatches=num_microbatches, costs=steering, memory_limit=memory_limit,
            **options,
        ), num_ranks, num_microbatches))

    schedule = build(costs)
    median = costs.median() if costs.heterogeneous and not getattr(fn, "median_checked", False) else costs
    if median != costs:
        # A search steered by uneven per-stage costs can land on an order that the same search steered by
        # the median would beat; keeping the faster of the two under the true costs makes per-stage costs
        # never a loss, for every generator at once. A generator whose every candidate already went through
        # this (``auto``) sets ``median_checked`` and is built once; so is every generator given per-stage
        # costs that are already even (their median is themselves, e.g. a reference's median steering).
        schedule = _faster(schedule, build(median), costs)
    if memory_limit is not None:
        peak = max(peak_memory(schedule, input_grad_frees))
        if peak > memory_limit + 1e-9:
            raise ValueError(
                f"schedule {schedule.name!r} needs {peak:g} M_B of activations on its busiest rank, above "
                f"memory_limit={memory_limit:g}; raise the limit to at least {peak:g} or pick a schedule "
                f"with a lower peak (see `bubbleless-schedules compare`)"
            )
    return schedule


_FIXED = frozenset({"num_ranks", "num_microbatches", "costs", "memory_limit"})
_UNIVERSAL = frozenset({"input_grad_frees"})
"""Options every generator may be given: a generator that does not take it does not depend on it."""


def _options_for(fn: Generator, name: str, options: dict) -> dict:
    """The options ``fn`` takes; an option it does not take is a ValueError naming those it does.

    A generator with ``**options`` checks its own; one with named keywords is checked here, so a typo
    (``chunk_per_rank=3``) fails instead of being silently ignored.
    """
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return options
    accepted = {p.name for p in parameters} - _FIXED
    unknown = sorted(set(options) - accepted - _UNIVERSAL)
    if unknown:
        takes = ", ".join(sorted(accepted | _UNIVERSAL))
        raise ValueError(f"schedule {name!r} takes no option {', '.join(unknown)}; its options are: {takes}")
    return {key: value for key, value in options.items() if key in accepted}


def _check_result(name: str, schedule: object, num_ranks: int, num_microbatches: int) -> Schedule:
    """``schedule`` when it is a ``Schedule`` of the shape asked, else a ValueError naming the generator:
    the validator checks a schedule against its own header, so one of another shape would pass it (and
    win ``auto`` and ``compare`` with fewer micro-batches to run). Workers are ranks, or a round-robin
    pool's devices: ``num_ranks`` counts either."""
    if not isinstance(schedule, Schedule):
        raise ValueError(
            f"generator {name!r} returned {type(schedule).__name__} {schedule!r:.80}, not a Schedule; a "
            f"registered generator must return a bubbleless_schedules.Schedule (or raise ValueError for a "
            f"shape it refuses)"
        )
    if schedule.num_microbatches != num_microbatches:
        raise ValueError(
            f"generator {name!r} returned a schedule of {schedule.num_microbatches} micro-batches; "
            f"{num_microbatches} were asked (a generator must schedule num_microbatches, or refuse the shape "
            f"with a ValueError)"
        )
    if schedule.num_workers != num_ranks:
        raise ValueError(
            f"generator {name!r} returned a schedule of {schedule.num_workers} workers; {num_ranks} ranks "
            f"were asked (one action row per rank, or per pool device, even an idle one)"
        )
    return schedule


def _as_is(schedule: Schedule) -> Schedule:
    return schedule


def _faster(first: Schedule, second: Schedule, costs: Costs) -> Schedule:
    """The schedule with the shorter simulated makespan under ``costs`` (``first`` on a tie)."""
    spans = [simulated_makespan(s, costs) for s in (first, second)]
    return second if spans[1] < spans[0] - 1e-9 else first


_loaded = False


def _load_builtin() -> None:
    """Import the built-in generators once, on first use (never at package import).

    ``_loaded`` is set before the import: the built-in modules call ``register``, which calls this, and
    must find it done rather than import the package they are part of again."""
    global _loaded
    if not _loaded:
        _loaded = True
        from . import generators  # noqa: F401  (registers on import)
