"""The fast paths behind generation time (issue 2, section 4) give exactly what the plain code gives.

Each fast path is compared, on random schedules, with a straightforward reference written here the way
the code read before it was optimized: the simulator's whole-schedule rule tables and event loop against
a loop that asks the layout once per action, the validator's one-pass range and completeness checks
against the per-action ones, the V search's block tokens against ``as_tokens(block_orders(...))``, and
the V list scheduler's inlined timing against the simulator. Timing itself is measured by the bench
(bench/schedules/compare.py, section d), never here.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bubbleless_schedules import Action, Costs, Schedule, generate, peak_memory, simulate, validate
from bubbleless_schedules.action import Kind
from bubbleless_schedules.generators.vshape import _peak_chunks, block_tokens
from bubbleless_schedules.generators.vshape_blocks import as_tokens, block_orders
from bubbleless_schedules.generators.vshape_greedy import Policy, v_list_schedule
from bubbleless_schedules.layouts import _computes_complete, _missing_computes, layout_of
from bubbleless_schedules.lowering import add_communication
from bubbleless_schedules.placement import v_placement
from bubbleless_schedules.validate import _action_problem, _row_in_range

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = ["1f1b", "zb", "zb-h1", "interleaved-1f1b", "zbv", "v-half", "v-min", "dualpipev", "roundrobin"]


# -- the references: one layout call per action, as the simulator and validator read before -----------
def reference_run(schedule: Schedule, costs: Costs) -> tuple[list, tuple[float, ...]]:
    """(spans as (worker, action, start, end) in execution order, peak memory), or raises ValueError."""
    layout = layout_of(schedule)
    workers = schedule.actions
    requires = [[layout.requires(a, schedule) for a in row] for row in workers]
    durations = [[layout.cost(a, schedule, costs) for a in row] for row in workers]
    happened: dict = {}
    waiting: dict = defaultdict(list)
    position, free_at, spans = [0] * len(workers), [0.0] * len(workers), []
    ready = list(range(len(workers)))
    while ready:
        worker = ready.pop()
        row = workers[worker]
        while position[worker] < len(row):
            i = position[worker]
            start, blocked_on = free_at[worker], None
            for event in requires[worker][i]:
                if event not in happened:
                    blocked_on = event
                    break
                time, source = happened[event]
                start = max(start, time + (costs.comm if source != worker else 0.0))
            if blocked_on is not None:
                waiting[blocked_on].append(worker)
                break
            end = start + durations[worker][i]
            spans.append((worker, row[i], start, end))
            free_at[worker], position[worker] = end, i + 1
            for event in layout.produces(row[i], schedule):
                if event in happened:
                    raise ValueError(f"{row[i]} produces {event} a second time")
                happened[event] = (end, worker)
                ready.extend(waiting.pop(event, ()))
    if any(position[w] < len(workers[w]) for w in range(len(workers))):
        raise ValueError("deadlock")
    peaks = []
    for row in workers:
        held = peak = 0.0
        for action in row:
            held += layout.memory_delta(action, schedule, 0.3)
            peak = max(peak, held)
        peaks.append(round(peak, 9))
    return spans, tuple(peaks)


def reference_missing(schedule: Schedule) -> bool:
    return not _missing_computes(schedule)


# -- random schedules: generated ones, lowered ones, and the same orders shuffled or damaged ------------
def random_costs(rng: random.Random, num_stages: int) -> Costs:
    def value():
        return round(rng.uniform(0.1, 3.0), 2)

    if rng.random() < 0.3:
        return Costs([value() for _ in range(num_stages)], [value() for _ in range(num_stages)],
                     [value() for _ in range(num_stages)], rng.choice([0.0, 0.25]))
    return Costs(value(), value(), value(), rng.choice([0.0, 0.1, 1.5]))


def random_schedule(rng: random.Random) -> Schedule:
    name = rng.choice(NAMES)
    p, m = rng.randint(1, 5), rng.randint(1, 9)
    try:
        schedule = generate(name, num_ranks=p, num_microbatches=m)
    except ValueError:
        schedule = generate("1f1b", num_ranks=p, num_microbatches=m)
    if schedule.layout == "pipeline" and schedule.stage_to_rank is not None and rng.random() < 0.25:
        schedule = add_communication(schedule)
    rows = [list(row) for row in schedule.actions]
    damage = rng.choice(["none", "swap", "shuffle", "drop", "duplicate"])
    row = rng.randrange(len(rows))
    if damage == "swap" and len(rows[row]) > 1:
        i = rng.randrange(len(rows[row]) - 1)
        rows[row][i], rows[row][i + 1] = rows[row][i + 1], rows[row][i]
    elif damage == "shuffle":
        rng.shuffle(rows[row])
    elif damage == "drop" and rows[row]:
        rows[row].pop(rng.randrange(len(rows[row])))
    elif damage == "duplicate" and rows[row]:
        rows[row].insert(rng.randrange(len(rows[row]) + 1), rng.choice(rows[row]))
    return schedule.replace(actions=rows)


def outcome(fn):
    try:
        return fn()
    except (ValueError, IndexError) as exc:
        return type(exc).__name__, str(exc).splitlines()[0].split(": ", 1)[-1][:40]


@SETTINGS
@given(st.integers(0, 10**9))
def test_simulate_equals_the_per_action_reference(seed):
    rng = random.Random(seed)
    schedule = random_schedule(rng)
    costs = random_costs(rng, schedule.num_stages) if schedule.layout == "pipeline" else Costs.unit()

    def fast():
        timeline = simulate(schedule, costs, input_grad_frees=0.3)
        return [(s.worker, s.action, s.start, s.end) for s in timeline.spans], timeline.peak_memory

    got, want = outcome(fast), outcome(lambda: reference_run(schedule, costs))
    if layout_of(schedule).missing(schedule):  # simulate refuses part of a schedule; the reference runs it
        assert isinstance(got, tuple) and got[0] == "ValueError" and "incomplete schedule" in got[1], got
    elif isinstance(want, tuple) and want and want[0] == "ValueError":
        assert isinstance(got, tuple) and got[0] == "ValueError"  # the same refusal (messages differ in detail)
    else:
        assert got == want


@SETTINGS
@given(st.integers(0, 10**9))
def test_simulated_makespan_is_the_timelines(seed):
    """``auto`` times its candidates with ``simulated_makespan``: the same number as ``simulate``'s, and the
    same refusal of a deadlocked or incomplete schedule."""
    from bubbleless_schedules.simulate import simulated_makespan

    rng = random.Random(seed)
    schedule = random_schedule(rng)
    costs = random_costs(rng, schedule.num_stages) if schedule.layout == "pipeline" else Costs.unit()
    assert outcome(lambda: simulated_makespan(schedule, costs)) == outcome(lambda: simulate(schedule, costs).makespan)


@SETTINGS
@given(st.integers(0, 10**9))
def test_rule_tables_equal_the_per_action_methods(seed):
    rng = random.Random(seed)
    schedule = random_schedule(rng)
    layout = layout_of(schedule)
    costs = random_costs(rng, schedule.num_stages)
    requires, produces, durations = layout.rule_rows(schedule, costs)
    for w, row in enumerate(schedule.actions):
        assert requires[w] == [layout.requires(a, schedule) for a in row]
        assert produces[w] == [layout.produces(a, schedule) for a in row]
        assert durations[w] == [layout.cost(a, schedule, costs) for a in row]
        assert layout.memory_rows(schedule, 0.4)[w] == [layout.memory_delta(a, schedule, 0.4) for a in row]


@SETTINGS
@given(st.integers(0, 10**9))
def test_fast_validation_checks_agree_with_the_per_action_ones(seed):
    rng = random.Random(seed)
    schedule = random_schedule(rng)
    rows = [list(row) for row in schedule.actions]
    row = rows[rng.randrange(len(rows))]
    if row and rng.random() < 0.5:  # an action out of range or on the wrong rank
        a = row[rng.randrange(len(row))]
        stage = rng.choice([a.stage, a.stage + 1, schedule.num_stages])
        mb = a.microbatch if a.microbatch is None else rng.choice([a.microbatch, schedule.num_microbatches])
        row[row.index(a)] = Action(stage, a.kind, mb)
    schedule = schedule.replace(actions=rows)
    for worker, actions in enumerate(schedule.actions):
        slow = not any(_action_problem(schedule, worker, a) for a in actions)
        assert _row_in_range(schedule, worker, actions) == slow
    if schedule.layout == "pipeline":
        assert _computes_complete(schedule) == reference_missing(schedule)


def test_validation_still_names_the_first_problem():
    schedule = generate("1f1b", num_ranks=2, num_microbatches=2)
    rows = [list(r) for r in schedule.actions]
    rows[1][2] = Action(1, Kind.F, 5)
    with pytest.raises(ValueError, match=r"1F5: micro-batch 5 is out of range"):
        validate(schedule.replace(actions=rows))
    rows = [list(r) for r in schedule.actions]
    rows[0].remove(Action(0, Kind.B, 1))
    with pytest.raises(ValueError, match=r"stage 0 micro-batch 1 has 0 B, 0 I, 0 W"):
        validate(schedule.replace(actions=rows))


def _rescanning_stable_greedy(p: int, m: int, kind: str) -> list[list[Action]]:
    """The published greedy's sweep as first written: the whole rank's peak recomputed for every tried move."""
    from bubbleless_schedules.generators import vshape_stable as vs
    from bubbleless_schedules.generators.vshape_blocks import stable_block

    def peak(cells) -> int:
        held = top = 0
        for t in sorted(cells):
            held += 1 if cells[t][0] is Kind.F else -1 if cells[t][0] is Kind.W else 0
            top = max(top, held)
        return top

    n = 2 * p
    rank_of = [s if s < p else n - 1 - s for s in range(n)]
    grid: list[dict] = [{} for _ in range(p)]
    for (k_, stage), slot in stable_block(p, kind).items():
        if k_ is not Kind.W:
            for k in range(m):
                grid[rank_of[stage]][slot + 6 * k] = (k_, stage, k)
    for cells in grid:
        vs._fill_w(cells)
    at = {(k_, s, k): t for cells in grid for t, (k_, s, k) in cells.items()}
    peaks = [peak(cells) for cells in grid]
    for t, r, (k_, s, k) in sorted((t, r, c) for r, cells in enumerate(grid) for t, c in cells.items()):
        if k_ is Kind.W:
            continue
        cells = grid[r]
        for slot in range(vs._ready_slot(at, k_, s, k, n), t):
            if slot in cells:
                continue
            cells[slot] = cells.pop(t)
            if k_ is not Kind.F or peak(cells) <= peaks[r]:
                at[(k_, s, k)] = slot
                break
            cells[t] = cells.pop(slot)
    return [[Action(s, k_, k) for _, (k_, s, k) in sorted(cells.items())] for cells in grid]


@pytest.mark.parametrize("p", [2, 3, 4, 6, 9])
@pytest.mark.parametrize("kind", ["v-min", "v-half"])
def test_stable_greedy_keeps_its_peak_incrementally(p, kind):
    """vshape_stable updates each rank's held-activation levels per move instead of recomputing the peak
    per tried slot (which limited it to 6,200 actions): the orders are the rescanning sweep's."""
    from bubbleless_schedules.generators.vshape_stable import stable_greedy_orders

    for m in (1, p, 2 * p + 1, 3 * p):
        assert stable_greedy_orders(p, m, kind) == _rescanning_stable_greedy(p, m, kind), m


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_block_tokens_equal_the_action_orders(p):
    for m in (1, 2, 5, 13):
        for delay in range(0, 6 * p + 2, 3):
            assert block_tokens(p, m, delay) == [as_tokens(order, p) for order in block_orders(p, m, delay)]


@given(st.lists(st.sampled_from(["F0", "F1", "I0", "I1", "W"]), max_size=40))
def test_peak_chunks_equals_a_running_count(tokens):
    held = peak = 0
    for token in tokens:
        held += 1 if token[0] == "F" else -1 if token == "W" else 0
        peak = max(peak, held)
    assert _peak_chunks(tokens) == peak


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10**9))
@example(4, 7, 1)  # patience waited for an F1 the W-first order would not run first, then ran the W late
def test_v_list_scheduler_times_are_the_simulators(p, m, seed):
    """The list scheduler inlines the simulator's timing rule; the order it returns simulates to the
    makespan, rank spans and peak it reports."""
    rng = random.Random(seed)
    costs = random_costs(rng, 2 * p)
    cap = rng.choice([2.0, float(p + 2), float(2 * p)])
    policy = Policy(order=rng.choice([("I", "F1", "F0", "W"), ("F1", "I", "F0", "W")]),
                    reserve_all=rng.random() < 0.3, patience=rng.choice([0.0, 0.5]),
                    w_first_when_held=rng.choice([float("inf"), cap - 1]))
    result = v_list_schedule(p, m, costs, cap, policy, 0.5)
    schedule = Schedule(result.actions, num_stages=2 * p, num_microbatches=m, stage_to_rank=v_placement(p))
    timeline = simulate(validate(schedule), costs, input_grad_frees=0.5)
    assert timeline.makespan == pytest.approx(result.makespan, abs=1e-9)
    assert sum(timeline.span_of(r) for r in range(p)) == pytest.approx(result.span_sum, abs=1e-9)
    assert max(peak_memory(schedule, 0.5)) * 2 == pytest.approx(result.peak_chunks, abs=1e-9)
