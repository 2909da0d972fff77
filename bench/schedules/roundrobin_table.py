"""Section (h) of compare.py: ``roundrobin`` against RoundPipe's dispatch on RoundPipe-like profiles.

    python -m bench.schedules.roundrobin_table     # print the table only

Per model profile (``roundpipe_profiles``), 8 devices and 16 micro-batches (RoundPipe's simulator
setting) and 32: our generator given the per-layer costs (it picks cut, dispatch and B or I/W) against the
independent RoundPipe reference (``roundpipe_reference``: its rounds, aligned recompute and fused
head, over its own partitioner's cuts *and* ours, whichever is faster), both judged by the shared
simulator, single iteration and back to back (``simulate_steady``, async optimizer, ``STEADY`` iterations:
rows placed per iteration by a fixed rotation or first free, the shorter period, for both). Memory: ours is
generated within what RoundPipe's own dispatch holds per device (``rp_memory``: its peak layers of
weights as ``weight_limit``, its peak activations as ``memory_limit``), so it fits every device budget
RoundPipe fits; one column lifts the activation limit (RoundPipe's weights only). Lower bound:
the total work of our schedule / devices. One column judges our plan by its steady-state period
(``objective='period'``) instead. Goal (issue 11): ours/RoundPipe <= 0.95 on every model and a
steady-state bubble under 3%; rows that miss it are named.
"""

from __future__ import annotations

import sys
import time

from bubbleless_schedules import Kind, generate, simulate
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.generators.roundrobin_judge import PERIOD_ITERATIONS
from bubbleless_schedules.roundrobin_layout import held_weights, pool_groups
from bubbleless_schedules.simulate import peak_memory
from bubbleless_schedules.simulate_steady import pool_steady_state, steady_state

from . import roundpipe_reference as rp
from .roundpipe_profiles import profiles, with_uploads

DEVICES = 8
MICROBATCHES = (16, 32)
GOAL_RATIO = 0.95
GOAL_STEADY = 0.03
STEADY = PERIOD_ITERATIONS
"""Iterations every steady-state figure runs back to back, ours and RoundPipe's alike: as many as the
period objective and the pool's planner judge over (12; over 4 some plans have not settled)."""


def rows(devices: int = DEVICES, microbatches=MICROBATCHES) -> list[dict]:
    found = []
    for m in microbatches:
        for name, layer_costs in profiles().items():
            theirs = rp.roundpipe(layer_costs, num_devices=devices, num_microbatches=m)
            limits = rp_memory(theirs.schedule)  # ours holds no more weights nor activations than RoundPipe
            start = time.process_time()  # CPU seconds: the wall clock of a shared machine varies
            ours = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=layer_costs, **limits)
            seconds = time.process_time() - start
            costs = job_costs(layer_costs, pool_groups(ours))
            timeline = simulate(ours, costs)
            ours_steady = pool_steady_state(ours, costs, iterations=STEADY)  # as RoundRobinPipeline.steps runs them
            theirs_any = rp.roundpipe(layer_costs, num_devices=devices, num_microbatches=m,
                                      extra_cuts=[pool_groups(ours)])
            theirs_steady = steady_state(theirs_any.schedule, theirs_any.costs, iterations=STEADY)
            asynchronous = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=layer_costs,
                                    objective="period", **limits)
            asynchronous_steady = pool_steady_state(asynchronous, job_costs(layer_costs, pool_groups(asynchronous)),
                                                    iterations=STEADY)
            theirs_period = min(theirs_steady.period, steady_state(theirs.schedule, theirs.costs, iterations=STEADY).period)
            work = sum(s.end - s.start for s in timeline.spans)
            split_span = _makespan_or_none(layer_costs, devices, m, split_backward=True, **limits)
            fused_span = _makespan_or_none(layer_costs, devices, m, split_backward=False, **limits)
            weights_only = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=layer_costs,
                                    weight_limit=limits["weight_limit"])
            weights_only_costs = job_costs(layer_costs, pool_groups(weights_only))
            wide = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=layer_costs,
                            weight_limit=len(layer_costs.forward))
            wide_span = simulate(wide, job_costs(layer_costs, pool_groups(wide))).makespan
            uploads = with_uploads(layer_costs)
            loaded = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=uploads, **limits)
            loaded_costs = job_costs(uploads, pool_groups(loaded))
            in_order = steady_state(loaded, loaded_costs, iterations=STEADY)
            streamed = steady_state(loaded, loaded_costs, load_stream=True, iterations=STEADY)
            found.append({
                "model": name, "m": m, "ours": timeline.makespan, "roundpipe": theirs.makespan,
                "roundpipe_any_cut": theirs_any.makespan, "bound": work / devices,
                "ours_bubble": timeline.bubble_rate,
                "rp_bubble": simulate(theirs_any.schedule, theirs_any.costs).bubble_rate,
                "ours_steady": ours_steady.steady_bubble, "rp_steady": theirs_steady.steady_bubble,
                "async": asynchronous_steady.makespan, "async_steady": asynchronous_steady.steady_bubble,
                "async_period_ratio": asynchronous_steady.period / theirs_period,
                "seconds": seconds, "split": split_span, "fused": fused_span,
                "backward": "I/W" if any(a.kind is Kind.W for _, _, a in ours.all_actions()) else "B",
                "upload_slowdown": in_order.makespan / timeline.makespan,
                "stream_slowdown": streamed.makespan / timeline.makespan, "stream_steady": streamed.steady_bubble,
                "weights": _held_layers(ours), "rp_weights": _held_layers(theirs_any.schedule),
                "wide": wide_span, "wide_weights": _held_layers(wide), "wide_uploads": _uploads(wide),
                "uploads": _uploads(ours), "rp_uploads": _uploads(theirs_any.schedule),
                "layers": len(layer_costs.forward),
                "activations": max(peak_memory(ours)), "rp_activations": limits["memory_limit"],
                "weights_only": simulate(weights_only, weights_only_costs).makespan,
                "weights_only_steady": steady_state(weights_only, weights_only_costs, iterations=STEADY).steady_bubble,
                "weights_only_activations": max(peak_memory(weights_only)),
            })
    return found


def _makespan_or_none(layer_costs, devices: int, m: int, **options) -> float | None:
    """The simulated makespan of ``roundrobin`` with ``options``, or None when no plan fits its limits (I/W
    alone defers each W, whose micro-batch stays held, so it may not fit RoundPipe's activations)."""
    try:
        schedule = generate("roundrobin", num_ranks=devices, num_microbatches=m, layer_costs=layer_costs, **options)
    except ValueError:
        return None
    return simulate(schedule, job_costs(layer_costs, pool_groups(schedule))).makespan


def _ratio(value: float | None, reference: float) -> str:
    return "no fit" if value is None else f"{value / reference:.3f}"


def rp_memory(schedule) -> dict:
    """The memory RoundPipe's dispatch holds per device, as ``roundrobin`` limits: ``weight_limit`` its most
    layers of weights at once (``held_weights``), ``memory_limit`` its peak activations (M_B, the shared
    simulator's count: one micro-batch of its largest gradient group). Held to both, each bound separately
    (layers of weights, and M_B), ours holds no more weight layers and no more activations than RoundPipe's plan;
    the two peaks may fall at different moments, so in bytes this holds for layers of equal weights (a head much
    heavier than a decoder layer could make ours' same-moment peak the larger)."""
    return {"weight_limit": _held_layers(schedule), "memory_limit": max(peak_memory(schedule))}


def _held_layers(schedule) -> int:
    """The most layers of weights a device holds at once, counted as the pool prefetches and releases them
    (``held_weights``: a device may end a later-started job first)."""
    return held_weights(schedule)[1]


def _uploads(schedule) -> int:
    """Layers uploaded per step: each job's layers once per device that runs part of it (a split job's
    weights go to every device of the split; RoundPipe's rounds upload per round)."""
    groups, seen = pool_groups(schedule), set()
    for device, row in enumerate(schedule.actions):
        for action in row:
            if action.microbatch is not None:
                key = (device, action.stage) if "round_size" not in schedule.meta else \
                    (device, action.stage, action.microbatch // schedule.meta["round_size"][0])
                seen.add(key)
    return sum(len(groups.layers(key[1])) for key in seen)


def table(found: list[dict]) -> str:
    head = ["model", "m", "ours", "RoundPipe", "RP (any cut)", "ours/RP", "ours/bound", "goal: ours/bound <=",
            "bubble ours / RP",
            "steady ours / RP", "ours' backward", "B only / RP", "I/W only / RP", "uploads: in order / stream", "stream steady",
            "peak weights ours / RP (layers)", "peak activations ours / RP (M_B)", "layers uploaded ours / RP",
            "RP's weights only: ours/RP, steady, activations", "no weight limit: ours/RP, peak weights, uploaded",
            "judged by period: ours/RP, steady, period ours/RP", "gen s (CPU)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    misses = []
    for r in found:
        ratio = r["ours"] / r["roundpipe_any_cut"]
        if ratio > GOAL_RATIO + 1e-9 or r["ours_steady"] >= GOAL_STEADY:
            misses.append(f"{r['model']} m={r['m']} (ours/RP {ratio:.3f}, steady {r['ours_steady']:.3f})")
        lines.append("| " + " | ".join([
            r["model"], str(r["m"]), f"{r['ours']:.1f}", f"{r['roundpipe']:.1f}", f"{r['roundpipe_any_cut']:.1f}",
            f"{ratio:.3f}", f"{r['ours'] / r['bound']:.3f}", f"{GOAL_RATIO * r['roundpipe_any_cut'] / r['bound']:.3f}",
            f"{r['ours_bubble']:.3f} / {r['rp_bubble']:.3f}",
            f"{r['ours_steady']:.3f} / {r['rp_steady']:.3f}", r["backward"],
            _ratio(r["fused"], r["roundpipe_any_cut"]), _ratio(r["split"], r["roundpipe_any_cut"]),
            f"{r['upload_slowdown']:.3f} / {r['stream_slowdown']:.3f}", f"{r['stream_steady']:.3f}",
            f"{r['weights']} / {r['rp_weights']} of {r['layers']}",
            f"{r['activations']:.2f} / {r['rp_activations']:.2f}", f"{r['uploads']} / {r['rp_uploads']}",
            f"{r['weights_only'] / r['roundpipe_any_cut']:.3f}, {r['weights_only_steady']:.3f}, "
            f"{r['weights_only_activations']:.2f}",
            f"{r['wide'] / r['roundpipe_any_cut']:.3f}, {r['wide_weights']}, {r['wide_uploads']}",
            f"{r['async'] / r['roundpipe_any_cut']:.3f}, {r['async_steady']:.3f}, {r['async_period_ratio']:.3f}",
            f"{r['seconds']:.2f}",
        ]) + " |")
    verdict = ("Every row meets the goal (ours/RP <= 0.95, steady bubble < 3%) within RoundPipe's weights and "
               "activations." if not misses else
               "Missing the goal (ours/RP <= 0.95 and steady bubble < 3%) within RoundPipe's weights and activations: "
               + "; ".join(misses) + ".")
    short = [f"{r['model']} m={r['m']} ({GOAL_RATIO * r['roundpipe_any_cut'] / r['bound']:.3f})" for r in found
             if GOAL_RATIO * r["roundpipe_any_cut"] < r["bound"] - 1e-9]
    if short:
        verdict += (" No order of our cut can meet it where 0.95 x RP is below the cut's work / devices: "
                    + "; ".join(short) + " (within RoundPipe's activations the fused group is no larger than "
                    "RoundPipe's largest gradient group and recompute runs one micro-batch ahead).")
    loose = [f"{r['model']} m={r['m']} ({r['weights_only'] / r['roundpipe_any_cut']:.3f}, "
             f"{r['weights_only_steady']:.3f})" for r in found
             if r["weights_only"] / r["roundpipe_any_cut"] > GOAL_RATIO + 1e-9 or r["weights_only_steady"] >= GOAL_STEADY]
    verdict += (" Within RoundPipe's weights only (activations unbounded): "
                + ("every row meets it." if not loose else "missing on " + "; ".join(loose) + "."))
    judged = [f"{r['model']} m={r['m']} ({r['async'] / r['roundpipe_any_cut']:.3f}, {r['async_steady']:.3f})"
              for r in found if r["ours"] / r["roundpipe_any_cut"] <= GOAL_RATIO + 1e-9
              and r["ours_steady"] >= GOAL_STEADY and r["async_steady"] < GOAL_STEADY
              and r["async"] / r["roundpipe_any_cut"] <= GOAL_RATIO + 1e-9]
    if judged:
        verdict += (" Where only the steady bubble misses, the plan judged by its period (`objective='period'`, "
                    "RoundPipe's memory) meets both: " + "; ".join(judged) + ".")
    return "\n".join(lines) + "\n\n" + verdict


def section() -> str:
    return (
        f"## (h) Round-robin pool: ours vs RoundPipe's dispatch ({DEVICES} devices, modelled profiles)\n\n"
        "Memory constraint: every 'ours' column except the last two is generated within RoundPipe's own "
        "per-device memory: at most its peak layers of weights (`weight_limit`) and its peak activations "
        "(`memory_limit`, M_B: one micro-batch of its largest gradient group), taken from its fastest dispatch "
        "over its own cuts, each bound on its own (layers of weights, M_B), so ours never holds more weight layers "
        "or more activations than RoundPipe's plan (in bytes, for layers of equal weights: the two peaks may fall "
        "at different moments). Two jobs' weights at most per device in every column (the pool's "
        "prefetch rule). 'RP's weights only' lifts the activation limit: recompute ahead, deferred W and a "
        "larger fused group then hold many micro-batches (its peak activations are printed). "
        "RoundPipe = the independent reference over its own partitioner's cuts; RP (any cut) = the same "
        "dispatch also given our cut (the ratio uses this stronger one). Bubble = idle share of makespan x "
        f"devices; steady = {STEADY} back-to-back iterations (the one-step-stale optimizer), ours as our executor "
        "overlaps them (`RoundRobinPipeline.steps`, `simulate_steady.pool_steady_state`: each iteration's rows "
        "go first free, the rows that start first to the devices that end the previous iteration first, two "
        "iterations in flight at most), RoundPipe's the shorter period of that rule, unbounded, and every fixed "
        "rotation of its rows (`simulate_steady.steady_state`). Ours' backward: the generator's default "
        "runs each gradient job's B as I then W (W deferred into the device's waits) where that simulates "
        "faster, else B; the pool runs both (`bubbleless_runtime.pool_split`). B only = `split_backward=False`, "
        "I/W only = `split_backward=True`. Goal: the ours/bound the 5% goal needs with our cut's work "
        "(0.95 x RP / bound): near 1 it asks for almost no idle time at all, the wavefront's fill and drain "
        "included, or for a cut with less work (more layers in the fused group, which recompute nothing "
        "but then pace every gradient). Uploads = the profile with weight LOAD/STORE costs "
        "(`with_uploads`), ours regenerated under them, makespan over the compute-only one: LOAD in the "
        "compute order (the shared simulator) / on its own copy stream within two jobs' weights "
        "(`steady_state(load_stream=True)`); RoundPipe's own simulator models no uploads, so there is no "
        "reference column for them. Peak weights = the most layers of weights a device holds at once (at most two "
        "jobs', as the pool prefetches and releases them: `held_weights`); layers uploaded = per step, each job's layers once per device running part of it "
        "(RoundPipe: per round). 'no weight limit' = `weight_limit=num_layers` and no activation limit, "
        "where the simulator prefers "
        "a large fused group (little recompute) split over every device, holding most of the model's weights "
        "on each device. 'judged by period' = ours generated within RoundPipe's memory with "
        "`objective='period'`: the search's finalists judged by the steady-state period (an asynchronous "
        "executor's step) instead of one iteration's makespan (our pool executor's); its period over "
        "RoundPipe's (the shorter of its plans over its own cuts and over ours). A drain dealt over more "
        "devices ends one iteration sooner but leaves the devices free at once, where the next iteration's "
        "fill needs them one forward job apart. Profiles: bench/schedules/roundpipe_profiles.py (from the shapes, not "
        "measured).\n\n" + table(rows())
    )


if __name__ == "__main__":
    print(section())
    sys.exit(0)
