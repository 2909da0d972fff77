"""How good the schedules are (issue 2, section 4): four markdown tables, printed and saved.

    python bench/schedules/compare.py            # writes bench/results/schedules.md
    python bench/schedules/compare.py --out -    # print only

(a) unit costs: each schedule against its published closed form;
(b) realistic costs (the zero-bubble paper's 1.5B profile, a comm-heavy and a cheap-W variant) at
    p=8 m=24: our generators against our own implementations of the reference heuristics
    (bench/schedules/published_zb.py, reference_zb.py, reference_v.py: ``REFERENCE[name](*, num_ranks,
    num_microbatches, costs, memory_limit) -> Schedule``) under the same memory limit;
(c) heterogeneous stages (first stage 1.3x, last 2x for the LM head): generated with the true per-stage
    costs against generated with their median and run under the true costs;
(d) generation time at p=32 m=256.

Every schedule is found through ``available()`` and every reference through the REFERENCE tables, so
new generators and references show up without editing this file. Absent ones are listed as such.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import bubbleless_schedules
from bubbleless_schedules import Costs, Schedule, available, generate, simulate, validate

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "schedules.md"
REFERENCE_MODULES = ("bench.schedules.published_zb", "bench.schedules.reference_zb", "bench.schedules.reference_v")

PAPER = Costs(18.5, 18.1, 9.3, 0.6)
COST_SETTINGS = {
    "paper 1.5B profile F=18.5 I=18.1 W=9.3 C=0.6": PAPER,
    "comm-heavy C=F/2=9.25": Costs(18.5, 18.1, 9.3, 9.25),
    "cheap W: W=F/4=4.6": Costs(18.5, 18.1, 4.6, 0.6),
}
P, M = 8, 24


def memory_limits(name: str, p: int) -> list[float | None]:
    """The limits each schedule is compared at: its design point (ZB-1p and ZB-2p for zb and auto)."""
    table = {
        "zb": [p, 2 * p], "auto": [p, 2 * p], "zb-h1": [p], "zb-h2": [2 * p], "zbv": [p],
        "v-half": [(p + 2) // 2], "v-min": [(p + 4) // 3], "dualpipev": [p + 1],
    }
    return table.get(name, [None])


# -- helpers ---------------------------------------------------------------------------------------------
def table(head: list[str], rows: list[list]) -> str:
    def cell(x) -> str:
        if isinstance(x, float) and x == int(x) and abs(x) < 1e6:
            return str(int(x))
        if isinstance(x, float):
            return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:140]


def load_references() -> tuple[dict[str, Callable[..., Schedule]], list[str]]:
    """REFERENCE tables of the reference modules that exist; notes for the ones that do not."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    found, notes = {}, []
    for module_name in REFERENCE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                notes.append(f"{module_name}: not written yet")
                continue
            raise
        found.update(getattr(module, "REFERENCE", {}))
    return found, notes


def run_reference(fn, p: int, m: int, costs: Costs, limit: float | None):
    """(timeline, note) for a reference heuristic, judged by the same validator and simulator as ours."""
    try:
        schedule = validate(fn(num_ranks=p, num_microbatches=m, costs=costs, memory_limit=limit))
    except ValueError as exc:
        return None, first_line(exc)
    timeline = simulate(schedule, costs)
    if limit is not None and timeline.max_peak_memory > limit + 1e-9:
        return None, f"over the limit ({timeline.max_peak_memory:g} M_B)"
    return timeline, ""


def run_ours(name: str, p: int, m: int, costs: Costs | None, limit: float | None):
    try:
        schedule = generate(name, num_ranks=p, num_microbatches=m, costs=costs, memory_limit=limit)
    except ValueError as exc:
        return None, first_line(exc)
    return simulate(schedule, costs), ""


# -- (a) closed forms ------------------------------------------------------------------------------------
CLOSED_FORMS = [
    # name, what, measure(timeline), formula(p, m, v), comparison
    ("gpipe", "bubble", lambda t: t.bubble_rate, lambda p, m, v: (p - 1) / (m + p - 1), "="),
    ("1f1b", "bubble", lambda t: t.bubble_rate, lambda p, m, v: (p - 1) / (m + p - 1), "="),
    ("1f1b", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: p, "="),
    ("interleaved-1f1b", "bubble", lambda t: t.bubble_rate, lambda p, m, v: (p - 1) / (v * m + p - 1), "="),
    ("zb-h1", "bubble", lambda t: t.bubble_rate, lambda p, m, v: (p - 1) / (3 * m + p - 1), "="),
    ("zb-h1", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: p, "<="),
    ("zb-h2", "span bubble", lambda t: t.span_bubble_rate, lambda p, m, v: 0.0, "="),
    ("zb-h2", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: 2 * p, "<="),
    ("zbv", "bubble", lambda t: t.bubble_rate, lambda p, m, v: (p - 1) / (6 * m + p - 1), "="),
    ("zbv", "span bubble", lambda t: t.span_bubble_rate, lambda p, m, v: 0.0, "="),
    ("zbv", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: p, "<="),
    ("v-half", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: (p + 2) // 2, "="),
    ("v-half", "makespan 3m+b(M)/2", lambda t: t.makespan, lambda p, m, v: v_makespan(p, m, 2 * ((p + 2) // 2)), "="),
    ("v-min", "peak M_B", lambda t: t.max_peak_memory, lambda p, m, v: (p + 4) // 3, "="),
    ("v-min", "makespan 3m+b(M)/2", lambda t: t.makespan, lambda p, m, v: v_makespan(p, m, 2 * ((p + 4) // 3)), "="),
]


def v_bubble_slots(p: int, big_m: int) -> int:
    """The PCM closed form b(M): idle chunk slots per rank of a V schedule holding ``big_m`` chunk activations."""
    return 3 * p - 1 - 3 * big_m + max(3 * p, p + 1 + 2 * ((big_m + 1) // 2))


def v_makespan(p: int, m: int, big_m: int) -> float:
    """Unit per-rank costs (a chunk slot is 1/2): 3m of work plus b(M) idle slots, never below the ramp of
    p-1 slots every V schedule has (b(2p) = 0 counts idle inside the spans; the makespan adds the ramp)."""
    return 3 * m + max(v_bubble_slots(p, big_m), p - 1) / 2
CLOSED_FORM_SHAPES = ((4, 8), (8, 24), (8, 32))
V_CLOSED_FORM_SHAPES = ((4, 4), (4, 8), (4, 13), (8, 16), (8, 25), (16, 32), (16, 49))
"""Where V-Half's and V-Min's makespan closed form is checked (p=2: their cap is 2p, ZB-V's closed form)."""
SHAPES_OF = {"makespan 3m+b(M)/2": V_CLOSED_FORM_SHAPES}
CHECK = {"=": lambda a, b: abs(a - b) <= 1e-9, "<=": lambda a, b: a <= b + 1e-9}


def closed_forms() -> str:
    rows = []
    names = set(available())
    for name, what, measure, formula, op in CLOSED_FORMS:
        for p, m in SHAPES_OF.get(what, CLOSED_FORM_SHAPES):
            if name not in names:
                rows.append([name, p, m, what, "not registered yet", "", "", ""])
                break
            timeline, why = run_ours(name, p, m, None, None)
            if timeline is None:
                rows.append([name, p, m, what, f"refused: {why}", "", "", ""])
                continue
            ours, expected = measure(timeline), formula(p, m, timeline.schedule.stages_per_rank)
            ok = CHECK[op](ours, expected)
            rows.append([name, p, m, what, float(ours), op, float(expected), "yes" if ok else "**NO**"])
    return "### (a) Unit costs against the closed forms\n\n" + table(
        ["schedule", "p", "m", "quantity", "ours", "", "closed form", "holds"], rows
    )


# -- (b) realistic costs against the reference heuristics ------------------------------------------------
def against_references(references: dict, notes: list[str]) -> str:
    """Every generator of ours at its design limits; beside it the reference of the same name, if any."""
    out = ["### (b) Realistic costs, p=8 m=24: ours against the reference heuristics, same memory limit\n"]
    if not references:
        out.append("No reference heuristics available (" + "; ".join(notes) + "): our column only.\n")
    theirs_by_name = {(bubbleless_schedules.canonical_name(n) if _known(n) else n): fn for n, fn in references.items()}
    names = available()
    for label, costs in COST_SETTINGS.items():
        rows = []
        for name in names + sorted(set(theirs_by_name) - set(names)):
            for limit in memory_limits(name, P):
                theirs, their_note = (None, "no reference") if name not in theirs_by_name else run_reference(
                    theirs_by_name[name], P, M, costs, limit)
                if name not in names:
                    rows.append(_pair_row(name, limit, None, theirs, "no generator of ours by this name"))
                    continue
                if limit is None and theirs is not None:
                    limit = theirs.max_peak_memory  # hold ours to the memory the reference used
                ours, our_note = run_ours(name, P, M, costs, limit)
                rows.append(_pair_row(name, limit, ours, theirs, our_note or their_note))
        if "auto" in names and references:
            for limit in sorted({P, 2 * P}):
                fits = [run_reference(fn, P, M, costs, limit)[0] for fn in references.values()]
                best = min((t for t in fits if t is not None), key=lambda t: t.makespan, default=None)
                ours, note = run_ours("auto", P, M, costs, limit)
                row = _pair_row("auto", limit, ours, best, note)
                row[0] = f"auto vs best reference ({best.schedule.name if best else '-'})"
                rows.append(row)
        out.append(f"**{label}**\n")
        out.append(table(["schedule", "limit M_B", "ours", "theirs", "ours/theirs", "note"], rows) + "\n")
    return "\n".join(out)


def _known(name: str) -> bool:
    try:
        bubbleless_schedules.canonical_name(name)
        return True
    except ValueError:
        return False


def _pair_row(name, limit, ours, theirs, note) -> list:
    ratio = ours.makespan / theirs.makespan if ours and theirs else None
    verdict = "" if ratio is None else ("faster" if ratio < 1 - 1e-9 else "equal" if ratio <= 1 + 1e-9 else "**SLOWER**")
    return [
        name, limit, ours.makespan if ours else "-", theirs.makespan if theirs else "-",
        f"{ratio:.4f} {verdict}" if ratio is not None else "-", note,
    ]


# -- (c) heterogeneous stages ----------------------------------------------------------------------------
def heterogeneous_costs(num_stages: int, stages_per_rank: float) -> Costs:
    """The paper's profile split evenly over stages, the first stage 1.3x (embedding), the last 2x (LM head)."""
    factor = [1.0] * num_stages
    factor[0], factor[-1] = 1.3, 2.0
    if num_stages == 1:
        factor = [2.0]

    def per_stage(total: float) -> list[float]:
        return [total / stages_per_rank * f for f in factor]

    return Costs(per_stage(PAPER.forward), per_stage(PAPER.backward_input), per_stage(PAPER.backward_weight),
                 PAPER.comm)


def heterogeneous() -> str:
    rows = []
    for name in available():
        limit = memory_limits(name, P)[0]
        shape, why = run_ours(name, P, M, None, limit)
        if shape is None or shape.schedule.layout != "pipeline":
            rows.append([name, limit, "-", "-", "-", why or f"{shape.schedule.layout} layout: stages not bound"])
            continue
        true = heterogeneous_costs(shape.schedule.num_stages, shape.schedule.stages_per_rank)
        aware, why_aware = run_ours(name, P, M, true, limit)
        try:
            blind_schedule = generate(name, num_ranks=P, num_microbatches=M, costs=true.median(), memory_limit=limit)
            blind = simulate(blind_schedule, true)
        except ValueError as exc:
            blind = None
            why_aware = why_aware or first_line(exc)
        gain = blind.makespan / aware.makespan if aware and blind else None
        rows.append([name, limit, aware.makespan if aware else "-", blind.makespan if blind else "-",
                     f"{gain:.4f}" if gain else "-", why_aware])
    return (
        "### (c) Heterogeneous stages (first 1.3x, last 2x), paper profile, p=8 m=24\n\n"
        "Both columns are simulated under the true per-stage costs; only what the generator was told differs.\n\n"
        + table(["schedule", "limit M_B", "true per-stage costs", "told the median", "gain (median/true)", "note"],
                rows)
    )


# -- (d) generation time ---------------------------------------------------------------------------------
def _timed(fn):
    """(result, wall seconds, CPU seconds): CPU time is the verdict, since the bench machine is shared."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def generation_time() -> str:
    p, m = 32, 256
    rows = []
    searches = []  # zb's and the V family's searches are cached (auto asks each the same question): time them cold
    try:
        from bubbleless_schedules.generators.zb_auto import search as zb_search

        searches.append(zb_search)
    except ImportError:
        pass
    try:
        from bubbleless_schedules.generators.vshape import search_v_schedule

        searches.append(search_v_schedule)
    except ImportError:
        pass
    # every stage-bound name (roundrobin dispatches layer costs over a pool: its time is in section (h))
    for name in [n for n in available() if n != "roundrobin"]:
        if name not in available():
            rows.append([name, "-", "-", "-", "-", "not registered yet"])
            continue
        for limit in memory_limits(name, p):
            runs, note = [], ""
            for _ in range(3):
                for search in searches:
                    search.cache_clear()
                try:
                    runs.append(_timed(partial(generate, name, num_ranks=p, num_microbatches=m, costs=PAPER,
                                               memory_limit=limit)))
                except ValueError as exc:
                    note = first_line(exc)
                    break
                if runs[-1][2] > 5:
                    break
            if not runs:
                rows.append([name, limit, "-", "-", "-", note])
                continue
            schedule, wall, cpu = min(runs, key=lambda r: r[2])
            _, _, checking = _timed(partial(validate, schedule))
            rows.append([name, limit, f"{cpu:.3f}", f"{wall:.3f}", f"{checking:.3f}",
                         "under 1 s" if cpu < 1 else "**over 1 s**"])
    return (
        f"### (d) Generation time, p={p} m={m}, paper profile (best of 3 by CPU time)\n\n"
        "`generate()` includes validating the result and checking its memory; the validation alone is shown "
        "beside it.\n\n"
        + table(["schedule", "limit M_B", "generate() CPU s", "wall s", "of which validate CPU s", "verdict"], rows)
    )


# -- (f) the ZB family on the issue-11 grid ----------------------------------------------------------------
ZB_NAMES = ("zb-h1", "zb-h2", "zb", "auto")


def _zb_refs(name: str, p: int, limit: float):
    """(label, fn) of the published ZB algorithms ``name`` is held to under ``limit`` (None: not compared)."""
    from bench.schedules import published_zb as pub

    heuristic = ("sail-sg heuristic", pub.zb_heuristic)
    if name == "zb-h1":
        return [heuristic, ("handcrafted H1", pub.handcrafted_zb_h1)] if limit == p else None
    if name == "zb-h2":
        return [heuristic, ("handcrafted H2", pub.handcrafted_zb_h2)] if limit == 2 * p else None
    if name == "zb":
        return [heuristic]
    return [heuristic, ("handcrafted H1", pub.handcrafted_zb_h1), ("handcrafted H2", pub.handcrafted_zb_h2)]


def _v_family():
    """bench/schedules/v_family.py when the V-family engineer's module is there, else None."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module("bench.schedules.v_family")
    except ModuleNotFoundError as exc:
        if exc.name and "bench.schedules.v_family".startswith(exc.name):
            return None
        raise


def zb_best_reference(name: str, case, refs) -> tuple[float, str] | None:
    """(makespan, label) of the fastest reference fitting ``case.memory_limit``, timed with the true costs.
    Each reference schedules with the true costs and, for per-stage profiles, also with their median (as
    upstream does), the faster kept. ``auto`` is also held to the V family's references (homogeneous
    profiles only: a per-stage profile of p stages is another model than one of 2p V stages)."""
    true, limit = case.costs, case.memory_limit
    best = None
    steering = (true, true.median()) if true.heterogeneous else (true,)
    for label, fn in refs:
        for costs in steering:
            try:
                schedule = validate(fn(num_ranks=case.p, num_microbatches=case.m, costs=costs, memory_limit=limit))
            except ValueError:
                continue
            timeline = simulate(schedule, true)
            if timeline.max_peak_memory <= limit + 1e-9 and (best is None or timeline.makespan < best[0] - 1e-9):
                best = (timeline.makespan, label)
    vf = _v_family() if name == "auto" and not true.heterogeneous else None
    if vf is not None:
        for v_name in vf.NAMES:
            cap = vf.CAP[v_name](case.p)
            if cap > limit + 1e-9:
                if v_name == "dualpipev" or limit < 1:
                    continue
                cap = limit
            found = vf.best_reference(v_name, case.p, case.m, case.costs_name, float(cap))
            if found is not None and (best is None or found[0] < best[0] - 1e-9):
                best = (found[0], f"{v_name}: {found[1]}")
    return best


def zb_family_cases(names=ZB_NAMES, quick: bool = False, full: bool = False, auto_ps=(2, 4, 8)):
    """(name, case, ours, reference, which) over the grid: p <= 16 and p=32 at m <= 2p unless ``full``;
    ``auto`` (which runs every registered generator) on p in ``auto_ps`` unless ``full``."""
    from bench.schedules.grid import cases

    found = []
    for case in cases(quick=quick):
        if not full and case.p == 32 and case.m > 2 * case.p:
            continue
        for name in names:
            if name == "auto" and not full and case.p not in auto_ps:
                continue
            refs = _zb_refs(name, case.p, case.memory_limit)
            if refs is None:
                continue
            ref = zb_best_reference(name, case, refs)
            if ref is None:
                continue
            limit = None if name in ("zb-h1", "zb-h2") else case.memory_limit
            try:
                ours = simulate(generate(name, num_ranks=case.p, num_microbatches=case.m, costs=case.costs,
                                         memory_limit=limit), case.costs).makespan
            except ValueError:
                ours = float("inf")
            found.append((name, case, ours, ref[0], ref[1]))
    return found


def _group(p: int) -> str:
    return "p<=4" if p <= 4 else f"p={p}"


def ratio_rows(found) -> list[list]:
    """[generator, costs, shapes, cases, worst, geomean, slower cases] per generator, profile and p group."""
    import math

    groups: dict[tuple, list] = {}
    for name, case, ours, ref, which in found:
        groups.setdefault((name, case.costs_name, _group(case.p)), []).append((case, ours / ref, which))
    rows = []
    from bench.schedules.grid import PROFILES

    order = lambda key: (ZB_NAMES.index(key[0]), PROFILES.index(key[1]), int(key[2].split("=")[-1]))  # noqa: E731
    for (name, profile, group), items in sorted(groups.items(), key=lambda kv: order(kv[0])):
        ratios = [r for _, r, _ in items]
        fails = [f"p={c.p} m={c.m} limit={c.memory_limit:g}: {r:.4f} vs {w}" for c, r, w in items if r > 1 + 1e-9]
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if max(ratios) < math.inf else math.inf
        rows.append([name, profile, group, len(items), f"{max(ratios):.4f}", f"{geo:.4f}",
                     ("**FAIL** " + "; ".join(fails[:3]) + (f" (+{len(fails) - 3})" if len(fails) > 3 else ""))
                     if fails else "-"])
    return rows


def zb_family(quick: bool = False, full: bool = False) -> str:
    wall = time.perf_counter()
    found = zb_family_cases(quick=quick, full=full)
    return zb_family_text(found, quick, full, time.perf_counter() - wall)


def zb_family_text(found, quick: bool, full: bool, seconds: float) -> str:
    """Section (f) from its cases (``zb_family_cases``), which took ``seconds``."""
    rows = ratio_rows(found)
    failures = [r for r in rows if r[-1] != "-"]
    scope = "grid.QUICK shapes" if quick else ("the whole grid" if full else
                                               "p <= 16 and p=32 at m <= 2p; auto on p <= 8")
    return (
        "### (f) ZB family on the issue-11 grid: ours / best independent reference, same memory limit\n\n"
        f"Grid `bench/schedules/grid.py` ({scope}), references `bench/schedules/published_zb.py` (sail-sg's "
        "heuristic under p for zb-h1, 2p for zb-h2, the case's limit for zb and auto; the handcrafted H1/H2; "
        "for auto also the V family's references). Worst and geomean of ours/reference; above 1.000 fails. "
        f"{len(found)} cases in {seconds:.0f} s.\n\n"
        + table(["generator", "costs", "shapes", "cases", "worst", "geomean", "slower cases"], rows)
        + ("\n\n**Failures: " + ", ".join(f"{r[0]} {r[1]} {r[2]}" for r in failures) + "**" if failures
           else "\n\nNo row above 1.000.")
    )


def v_family(quick: bool = False, full: bool = False) -> str:
    vf = _v_family()
    if vf is None:
        return "### (g) V family on the issue-11 grid\n\nbench/schedules/v_family.py is not written yet."
    return v_family_text(vf.comparison_rows(quick=quick, full=full))


def v_family_text(rows) -> str:
    """Section (g) from ``v_family`` rows."""
    return "### (g) V family on the issue-11 grid (bench/schedules/v_family.py)\n\n" + _v_family().markdown(rows)


# -- the record ------------------------------------------------------------------------------------------
PUBLISHED = [  # (schedule, memory limit, m, the zero-bubble paper's bubble rate), 1.5B model on 8 A100s
    ("1f1b", None, 24, 0.2431), ("zb-h1", None, 24, 0.1585), ("zb-h2", None, 24, 0.1083),
    ("zb", 16, 24, 0.0433), ("zb", 16, 32, 0.0039),
]


def published_numbers() -> str:
    """The paper's bubble rates from its profiled F/B/W/C, with W keeping 40% of the activations."""
    costs, frees = Costs(18.52, 18.09, 9.34, 0.6), 0.6
    rows = []
    for name, limit, m, published in PUBLISHED:
        schedule = generate(name, num_ranks=8, num_microbatches=m, costs=costs, memory_limit=limit,
                            input_grad_frees=frees)
        timeline = simulate(schedule, costs, input_grad_frees=frees)
        label = f"{name} ({'ZB-2p' if limit == 16 else 'as published'})" if name == "zb" else name
        if name == "zb-h2":
            label = "zb-h2 (published: the pattern; ours searches under 2p past it, as sail-sg's zb-h2)"
        rows.append([label, m, f"{timeline.span_bubble_rate:.4f}", f"{published:.4f}",
                     f"{timeline.bubble_rate:.4f}"])
    return (
        "### (e) The zero-bubble paper's published bubble rates\n\n"
        "p=8, costs F=18.52 I=18.09 W=9.34 C=0.6 ms (their 1.5B profile), input_grad_frees=0.6. Their rate is "
        "the worst rank's idle share inside its own span, our `span_bubble_rate`.\n\n"
        + table(["schedule", "m", "ours", "published", "whole-makespan bubble"], rows)
    )


def commit() -> str:
    """The checkout's short commit hash, or 'unknown' outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def provenance() -> str:
    return (
        f"Run {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} on {platform.node() or 'host'}: "
        f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}; bubbleless-schedules {bubbleless_schedules.__version__} "
        f"at commit {commit()}. Memory model in (a)-(d): I frees nothing, W frees the micro-batch "
        f"(input_grad_frees=0). "
        f"Schedules registered: {', '.join(available())}."
    )


def roundrobin_section() -> str:
    """(h): ``roundrobin`` against the RoundPipe dispatch reference (bench/schedules/roundrobin_table.py)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.schedules.roundrobin_table").section()


def report(quick: bool = False, full: bool = False) -> str:
    references, notes = load_references()
    parts = [
        "# Schedules: closed forms, reference heuristics, heterogeneous stages, generation time",
        "Generated by `python bench/schedules/compare.py`; do not edit by hand.",
        provenance(),
        closed_forms(),
        against_references(references, notes),
        heterogeneous(),
        generation_time(),
        published_numbers(),
        zb_family(quick=quick, full=full),
        v_family(quick=quick, full=full),
        roundrobin_section(),
    ]
    if notes:
        parts.append("Notes: " + "; ".join(notes))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS), help="markdown file to write ('-' to only print)")
    parser.add_argument("--quick", action="store_true", help="grid sections (f), (g) on grid.QUICK shapes only")
    parser.add_argument("--full", action="store_true", help="grid sections on every shape, p=32 m=256 too (slow)")
    args = parser.parse_args(argv)
    text = report(quick=args.quick, full=args.full)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
