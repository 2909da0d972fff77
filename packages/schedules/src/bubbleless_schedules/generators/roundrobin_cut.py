"""Candidate cuts of a per-layer profile for the round-robin pool, tried by the simulator.

A cut packs layers greedily under a job-time cap per micro-batch (forward: F per layer; backward: R + B;
the fused last group: F + B of the LM head and the layers below it that fit). The wavefront's fill and
drain are paced by the first jobs' and the last jobs' micro-batch times: device d starts its first job
only when micro-batch 0 has passed the d jobs before it. So a cut may *taper*: its first forward groups
and its last-run backward groups (the model's first layers) hold fewer layers, the fill and drain get
shorter and the devices that run those short jobs take further jobs sooner.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..costs import Costs
from ..roundrobin_layout import PoolGroups

LAYER_FIELDS = ("forward", "backward_input", "backward_weight", "recompute", "load", "store")


def check_layer_costs(layer_costs: Costs) -> int:
    """The layer count (LM head last) when every sequence field has one value per layer."""
    if not isinstance(layer_costs, Costs):
        raise ValueError(f"layer_costs must be a Costs with one value per layer, got {type(layer_costs).__name__}")
    lengths = {name: len(getattr(layer_costs, name)) for name in LAYER_FIELDS
               if isinstance(getattr(layer_costs, name), tuple)}
    if "forward" not in lengths:
        raise ValueError("layer_costs.forward must be a sequence with one value per layer (the LM head last)")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"layer_costs sequences differ in length ({lengths}); give each field one value per layer, "
                         "in model order with the LM head last")
    count = lengths["forward"]
    if count < 1:
        raise ValueError("layer_costs need at least one layer")
    return count


def layer(layer_costs: Costs, name: str, index: int) -> float:
    value = getattr(layer_costs, name)
    if name == "recompute" and value is None:
        value = layer_costs.forward
    return float(value[index]) if isinstance(value, tuple) else float(value)


def job_costs(layer_costs: Costs, groups: PoolGroups) -> Costs:
    """Per-job costs (the layout's per-stage sequences): each job's layers summed; forward jobs no B."""
    sums = {name: [] for name in LAYER_FIELDS}
    for job in range(groups.num_stages):
        role = groups.role(job)
        for name, values in sums.items():
            total = sum(layer(layer_costs, name, i) for i in groups.layers(job))
            values.append(0.0 if role == "forward" and name in ("backward_input", "backward_weight", "store")
                          else total)
    return Costs(tuple(sums["forward"]), tuple(sums["backward_input"]), tuple(sums["backward_weight"]),
                 layer_costs.comm, recompute=tuple(sums["recompute"]), load=tuple(sums["load"]),
                 store=tuple(sums["store"]))


def _pack(times: Sequence[float], caps: Sequence[float]) -> tuple[int, ...]:
    """Greedy in order; group g fills up to ``caps[min(g, len(caps) - 1)]``."""
    counts, total = [], None
    for t in times:
        cap = caps[min(len(counts) - 1, len(caps) - 1)] if counts else 0.0
        if total is not None and total + t <= cap + 1e-12:
            counts[-1] += 1
            total += t
        else:
            counts.append(1)
            total = t
    return tuple(counts)


def tapered_cut(layer_costs: Costs, cap: float, *, forward_cap: float | None = None, taper: int = 0,
                backward_taper: int | None = None) -> PoolGroups:
    """Groups under ``cap`` (backward, the fused group) and ``forward_cap`` (forward, default ``cap``); with
    ``taper`` t, the first t forward groups and the last ``backward_taper`` (default t) backward groups to
    run get caps of 1/(t+1), 2/(t+1), ... of the full cap."""
    count = check_layer_costs(layer_costs)
    forward_cap = cap if forward_cap is None else forward_cap
    f = [layer(layer_costs, "forward", i) for i in range(count)]
    b = [layer(layer_costs, "backward_input", i) + layer(layer_costs, "backward_weight", i) for i in range(count)]
    last, fused = 1, f[-1] + b[-1]
    while last < count and fused + f[-1 - last] + b[-1 - last] <= cap + 1e-12:
        fused += f[-1 - last] + b[-1 - last]
        last += 1
    body = count - last
    if body == 0:
        return PoolGroups((), last, ())
    backward_taper = taper if backward_taper is None else backward_taper
    forward = _pack(f[:body], [forward_cap * s for s in _steps(taper)])
    back = [layer(layer_costs, "recompute", i) + b[i] for i in range(body)]
    backward = _pack(back, [cap * s for s in _steps(backward_taper)])  # first layers first: they run last
    return PoolGroups(forward, last, backward)


def _steps(taper: int) -> list[float]:
    return [(k + 1) / (taper + 1) for k in range(taper)] + [1.0]


FACTORS = (0.8, 0.9, 1.0, 1.1, 1.3)
"""Job-time caps tried, in units of the slowest layer's job time (RoundPipe tries 1.0 to 1.1)."""

TAPERS = ((0, 0), (1, 1), (2, 2), (4, 2), (8, 2), (8, 0))
"""(forward, backward) tapers tried: a long forward taper (groups of 1, 2, 3 ... layers' worth) lets the
first devices start within a few layers' time of each other, a short backward one ends the drain."""


FINE_FORWARD = (0.6, 0.8, 1.0)
"""Forward caps of the fine cuts (``candidate_cuts``), in units of the slowest body layer's backward job
time (R + B): forward groups of about that many layers' backward work per micro-batch."""


def candidate_cuts(layer_costs: Costs, *, memory_fits=None) -> list[PoolGroups]:
    """Distinct cuts over caps around the slowest layer's job time, forward caps and tapers; per taper
    also the *fine* cuts, whose backward groups hold one body layer each (cap: the slowest body layer's
    R + B) and whose forward groups ``FINE_FORWARD`` of it. Where the fused group (often the LM head,
    whose F + B is several body layers' R + B) is slower than such groups, a fine cut only pays with the
    fused group split over devices (``roundrobin_search`` tries that split with it): many short jobs
    even out the work per device and shorten the fill and drain."""
    count = check_layer_costs(layer_costs)
    job = [layer(layer_costs, "forward", i) + layer(layer_costs, "backward_input", i)
           + layer(layer_costs, "backward_weight", i) + (layer(layer_costs, "recompute", i) if i < count - 1 else 0.0)
           for i in range(count)]
    slowest = max(job)
    body = max((layer(layer_costs, "recompute", i) + layer(layer_costs, "backward_input", i)
                + layer(layer_costs, "backward_weight", i) for i in range(count - 1)), default=0.0)
    cuts: list[PoolGroups] = []

    def add(groups: PoolGroups) -> None:
        if groups not in cuts and (memory_fits is None or memory_fits(groups)):
            cuts.append(groups)

    for taper, backward_taper in TAPERS:  # in this order: a search out of budget keeps the first tapers
        for factor in FACTORS:
            for forward_factor in (0.8, 1.0):
                add(tapered_cut(layer_costs, slowest * factor, forward_cap=slowest * factor * forward_factor,
                                taper=taper, backward_taper=backward_taper))
        for forward_factor in FINE_FORWARD if body > 0 else ():
            add(tapered_cut(layer_costs, body, forward_cap=body * forward_factor, taper=taper,
                            backward_taper=backward_taper))
    return cuts


def with_last(groups: PoolGroups, last: int) -> PoolGroups:
    """``groups`` with a fused last group of ``last`` layers: the top layers of the body move into it (the
    top forward and backward groups shrink, or go), the other groups stay."""
    if not 1 <= last < groups.num_layers:
        raise ValueError(f"a fused group of {last} layers needs 1 to {groups.num_layers - 1} (the model has "
                         f"{groups.num_layers} layers and a body of at least one)")
    body = groups.num_layers - last

    def trimmed(counts: tuple[int, ...]) -> tuple[int, ...]:
        kept, total = [], 0
        for count in counts:
            if total >= body:
                break
            kept.append(min(count, body - total))
            total += kept[-1]
        kept[-1] += body - total  # a longer body (a smaller fused group): the top group takes the rest
        return tuple(kept)

    return PoolGroups(trimmed(groups.forward or (body,)), last, trimmed(groups.backward or (body,)))
