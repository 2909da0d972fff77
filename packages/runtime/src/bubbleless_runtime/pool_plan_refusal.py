"""What the automatic pool plan says when no plan fits the budget: the leanest ``memory_budget`` to ask for.

``RoundRobinPipeline(memory_budget=...)`` is bytes per device; the search (``pool_plan.auto_groups``)
holds every plan to it, handing ``cut()`` half of it per group (a device holds two jobs). ``cut()``'s own
refusal speaks of that per-group ``memory_cap``, a knob the pool does not have, and its "smallest cap
that fits" is not the budget to ask for: a cut within it can still hold more on a device than twice it
(held micro-batches, uploads), and the generator's own plan may fit below it (measured on the tiny
test model: cut() asked for 56,896 per group, the search accepted 72,000, i.e. 36,000 per group).

So the refusal speaks of the device budget: each plan a larger budget could let through (``candidates``:
peak bytes on its fullest device, ``plan_peak_bytes``) is tried in ascending order as the budget
(``accepts``: the same search under it), and the first the search accepts is the figure given. A plan
that fits at its own peak may still not be chosen there (``cut()`` cuts differently under a larger cap),
so at most ``VERIFIED`` are tried; past them the message gives the leanest peak as a lower bound.

The figure is the search's answer for the profile it was given: the plan follows the timings, which each
build with ``partition="auto"`` measures again, so the message says how to keep them (``SAME_TIMINGS``).
"""

from __future__ import annotations

from collections.abc import Callable

from bubbleless_partition import Profile

SAME_TIMINGS = (
    "partition='auto' measures the layers' timings (and the copy bandwidth) again at each build, and the plan "
    "follows them, so a rebuild at that budget can be refused: measure once (bubbleless_runtime.pool_plan."
    "profile_layers(layers, sample_input, device), or pipe.profile of a pool built with partition='auto') and "
    "pass that Profile as partition= to plan on the same timings."
)
"""A named budget is the search's answer for the timings it was given (30 builds of the tiny test model with
each layer's times jittered by up to 30%: 3 refused the budget named for the unjittered profile)."""

VERIFIED = 3
"""Candidate budgets tried with the whole search before the message falls back to a lower bound."""


def no_plan_fits(profile: Profile, *, num_devices: int, device_budget: float | None, errors: list[str],
                 pinned: dict, candidates: list[tuple[float, str]],
                 accepts: Callable[[float], bool]) -> ValueError:
    """The ValueError for a search that found no plan within ``device_budget`` bytes a device (module
    docstring); ``pinned``: the layer-cost options every plan honoured, ``errors``: the cuts' refusals."""
    budget = "any memory_budget" if device_budget is None else \
        f"memory_budget={device_budget:.0f} bytes per device ({device_budget / 2**30:.3f} GiB)"
    held = (f" with schedule_options {', '.join(f'{k}={v!r}' for k, v in pinned.items())} (every plan tried "
            "honours them; drop them to let the planner choose)" if pinned else "")
    ordered = sorted(candidates)
    leanest = next(((peak, what) for peak, what in ordered[:VERIFIED] if accepts(peak)), None)
    if leanest is not None:
        why = (f"the leanest plan it finds, {leanest[1]}, holds {leanest[0]:.0f} bytes on its fullest device "
               "(weights and held micro-batches, plan_peak_bytes); the same search accepts "
               f"memory_budget={leanest[0]:.0f} on this profile's timings. {SAME_TIMINGS} Raise memory_budget to at "
               "least that")
    elif ordered:
        why = (f"no plan tried holds less than {ordered[0][0]:.0f} bytes on its fullest device ({ordered[0][1]}; "
               "weights and held micro-batches, plan_peak_bytes), so memory_budget must be at least that. "
               "Raise memory_budget")
    else:
        why = (errors[-1] if errors else "the layer-cost generator found none either") + ". Raise memory_budget"
    return ValueError(
        f"no round-robin plan of the {profile.num_layers} layers over {num_devices} devices fits {budget}{held}: "
        f"{why}, use shorter sequences or more micro-batches of the same batch, or pin smaller groups with "
        "partition="
    )


__all__ = ["SAME_TIMINGS", "VERIFIED", "no_plan_fits"]
