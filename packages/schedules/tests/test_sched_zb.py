"""ZB-H1, ZB-H2 and the automatic ``zb``: the papers' closed forms at unit costs, memory bounds, and
``zb`` against the simpler heuristics (against the published ones: test_sched_zb_published.py)."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Action, Costs, Kind, generate, simulate
from bubbleless_schedules.generators.zb_greedy import GreedyPolicy, evaluate_orders, run_greedy
from bubbleless_schedules.generators.zb_handcrafted import delayed_w_schedule
from bubbleless_schedules.placement import loop_placement
from bubbleless_schedules.schedule import Schedule

PAPER = Costs(18.5, 18.1, 9.3, 0.6)
COMM_HEAVY = Costs(18.5, 18.1, 9.3, 18.5 / 2)
CHEAP_W = Costs(18.5, 18.1, 4.6, 0.6)
SHAPES = [(p, m) for p in range(1, 7) for m in range(p, 3 * p + 3)]


def run(name: str, p: int, m: int, costs: Costs | None = None, **kw):
    return simulate(generate(name, num_ranks=p, num_microbatches=m, costs=costs, **kw), costs)


@pytest.mark.parametrize("p,m", SHAPES)
def test_closed_forms_at_unit_costs(p, m):
    """1F1B (p-1)/(m+p-1); ZB-H1 (p-1)/(3m+p-1) at 1F1B's memory; ZB-H2 no idle inside any rank's span."""
    one_f_one_b = run("1f1b", p, m)
    assert one_f_one_b.bubble_rate == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    h1 = run("zb-h1", p, m)
    assert h1.bubble_rate == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
    assert h1.makespan == 3 * m + p - 1
    assert h1.max_peak_memory == min(p, m)
    h2 = run("zb-h2", p, m)
    if m >= 2 * p - 1:  # the first rank's 2p-1 warm-up forwards need that many micro-batches
        assert h2.span_bubble_rate == pytest.approx(0.0, abs=1e-12)
    else:
        assert h2.span_bubble_rate > 0
    assert h2.max_peak_memory == min(2 * p - 1, m)  # exactly as the docstring says, <= 2p


def test_zb_h2_cuts_the_span_bubble_that_zb_h1_leaves():
    """The test above could pass with H1 == H2; show the difference: H1 idles inside spans, H2 does not."""
    assert run("zb-h1", 4, 8).span_bubble_rate > 0.05
    assert run("zb-h2", 4, 8).span_bubble_rate == 0.0


def test_handcrafted_orders_split_every_backward():
    schedule = generate("zb-h1", num_ranks=3, num_microbatches=4)
    kinds = {a.kind for row in schedule.actions for a in row}
    assert kinds == {Kind.F, Kind.I, Kind.W}
    assert str(schedule).splitlines()[3] == "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3"


@pytest.mark.parametrize("costs", [Costs.unit(), PAPER, COMM_HEAVY, CHEAP_W], ids=["unit", "paper", "comm", "cheapW"])
@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (4, 13), (6, 12), (8, 24)])
def test_zb_never_slower_than_the_simpler_heuristics(costs, p, m):
    at_p = run("zb", p, m, costs, memory_limit=p)
    assert at_p.max_peak_memory <= p
    for simpler in ("1f1b", "zb-h1"):
        assert at_p.makespan <= run(simpler, p, m, costs).makespan + 1e-9
    at_2p = run("zb", p, m, costs, memory_limit=2 * p)
    assert at_2p.max_peak_memory <= 2 * p
    assert at_2p.makespan <= run("zb-h2", p, m, costs).makespan + 1e-9
    assert at_2p.makespan <= at_p.makespan + 1e-9


def test_zb_reaches_the_ramp_bound_at_2p_with_the_paper_costs():
    """At 2p the last rank never idles after its first forward: makespan = (p-1)(F+C) + m(F+I+W)."""
    p, m = 8, 24
    timeline = run("zb", p, m, PAPER, memory_limit=2 * p)
    bound = (p - 1) * (18.5 + 0.6) + m * (18.5 + 18.1 + 9.3)
    assert timeline.makespan == pytest.approx(bound)
    pattern = delayed_w_schedule(p, m, lambda r: 2 * (p - 1 - r), lambda r: 2 * r, "pattern")
    assert simulate(pattern, PAPER).makespan > bound + 0.5  # the fixed order misses it ...
    assert run("zb-h2", p, m, PAPER).makespan == pytest.approx(bound)  # ... zb-h2 searches beside it


def test_zb_default_limit_is_1f1b_memory():
    assert run("zb", 6, 18, PAPER).max_peak_memory == 6
    assert run("zerobubble", 6, 18, PAPER).makespan == run("zb", 6, 18, PAPER).makespan


@pytest.mark.parametrize("frees", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("limit", [1, 2.5, 4, 7])
def test_zb_keeps_its_limit_under_any_input_grad_frees(frees, limit):
    schedule = generate(
        "zb", num_ranks=4, num_microbatches=10, costs=PAPER, memory_limit=limit, input_grad_frees=frees
    )
    assert simulate(schedule, PAPER, input_grad_frees=frees).max_peak_memory <= limit + 1e-9


def test_zb_uses_memory_freed_by_input_gradients():
    """When I frees most activations, more micro-batches fit under the same limit (between p and 2p)."""
    kept = run("zb", 8, 24, PAPER, memory_limit=10)
    freed = simulate(
        generate("zb", num_ranks=8, num_microbatches=24, costs=PAPER, memory_limit=10, input_grad_frees=0.6),
        PAPER, input_grad_frees=0.6,
    )
    assert freed.makespan < kept.makespan - 10.0
    assert freed.max_peak_memory <= 10 + 1e-9


def test_zb_uses_per_stage_costs():
    """A slow middle stage: scheduling for the true per-stage costs is never worse than for their median."""
    p, m = 4, 12
    forward = [18.5, 30.0, 18.5, 18.5]
    costs = Costs(forward, [18.1, 29.0, 18.1, 18.1], [9.3, 2.0, 9.3, 9.3], 0.6)
    aware = run("zb", p, m, costs, memory_limit=p)
    blind = simulate(generate("zb", num_ranks=p, num_microbatches=m, costs=costs.median(), memory_limit=p), costs)
    assert aware.makespan <= blind.makespan + 1e-9
    for span in aware.spans:
        if span.action.kind is Kind.F:
            assert span.end - span.start == pytest.approx(forward[span.action.stage])


@pytest.mark.parametrize("bad", [dict(memory_limit=0.5), dict(input_grad_frees=1.5)])
def test_zb_refuses_what_it_cannot_do(bad):
    with pytest.raises(ValueError, match="memory_limit|input_grad_frees"):
        generate("zb", num_ranks=4, num_microbatches=8, **bad)


def test_greedy_times_are_the_simulators():
    """The fast engine must time an order exactly as ``simulate`` does, or ``zb`` would pick wrongly."""
    for costs in (PAPER, COMM_HEAVY, Costs([1, 2, 3], [2, 1, 1], [0.5, 0.1, 2], 0.3)):
        for fit in (False, True):
            policy = GreedyPolicy(ahead=(3, 2, 1), memory_limit=3, w_only_if_it_fits=fit)
            result = run_greedy(3, 7, costs, policy)
            schedule = Schedule(
                [[Action(r, k, mb) for k, mb in row] for r, row in enumerate(result.orders)],
                num_stages=3, num_microbatches=7, stage_to_rank=loop_placement(3),
            )
            assert simulate(schedule, costs).makespan == pytest.approx(result.makespan)
            assert evaluate_orders(result.orders, costs, 3) == pytest.approx(result.makespan)


# -- against the independent published references: tests/test_sched_zb_published.py -------------------------
