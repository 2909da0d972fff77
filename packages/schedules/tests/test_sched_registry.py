"""The registry guards against custom generators: what one returns is checked against the shape asked, one
that fails with a bug is skipped by ``auto`` and listed by ``compare`` instead of breaking them, and a name
registered before the built-ins loaded is refused at once without losing any built-in."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from bubbleless_schedules import Schedule, available, generate, registry
from bubbleless_schedules.cli import compare_rows

P, M = 4, 16


@pytest.fixture
def plug_in(monkeypatch):
    """``plug_in(name, fn)`` registers ``fn`` for this test only (``auto``'s stage-bound probe forgets it)."""
    probe = importlib.import_module("bubbleless_schedules.generators.auto")._stage_bound
    available()  # the built-ins first, so monkeypatch's undo leaves them in place

    def add(name, fn):
        monkeypatch.setitem(registry._GENERATORS, name, fn)

    yield add
    probe.cache_clear()


def _too_few_microbatches(*, num_ranks, num_microbatches, costs, memory_limit):
    return generate("1f1b", num_ranks=num_ranks, num_microbatches=2)  # ignores num_microbatches


def _too_few_ranks(*, num_ranks, num_microbatches, costs, memory_limit):
    return generate("1f1b", num_ranks=max(1, num_ranks - 1), num_microbatches=num_microbatches)


def _nothing(*, num_ranks, num_microbatches, costs, memory_limit):
    return None


@pytest.mark.parametrize("fn, message", [
    (_too_few_microbatches, "generator 'buggy' returned a schedule of 2 micro-batches; 16 were asked"),
    (_too_few_ranks, "generator 'buggy' returned a schedule of 3 workers; 4 ranks were asked"),
    (_nothing, "generator 'buggy' returned NoneType None, not a Schedule"),
])
def test_a_result_of_another_shape_is_refused_naming_the_generator(plug_in, fn, message):
    plug_in("buggy", fn)
    with pytest.raises(ValueError, match=message):
        generate("buggy", num_ranks=P, num_microbatches=M)
    with pytest.raises(ValueError, match=message):
        generate("buggy", num_ranks=P, num_microbatches=M, validated=False)
    chosen = generate("auto", num_ranks=P, num_microbatches=M)
    assert chosen.num_microbatches == M and chosen.num_ranks == P
    ran, refused = compare_rows(P, M, None, None)
    assert "buggy" not in dict(ran) and dict(refused)["buggy"].startswith(message.split(",")[0])


@pytest.mark.parametrize("shape", [(1, 1), (2, 4), (3, 5), (4, 3), (8, 1)])
def test_every_built_in_returns_the_shape_asked(shape):
    p, m = shape
    for name in available():
        try:
            schedule = generate(name, num_ranks=p, num_microbatches=m)
        except ValueError as exc:
            assert "returned" not in str(exc), name
            continue
        assert isinstance(schedule, Schedule) and (schedule.num_workers, schedule.num_microbatches) == (p, m)


def _crashes(*, num_ranks, num_microbatches, costs, memory_limit):
    return [][num_ranks]


def test_a_generator_that_crashes_is_skipped_by_auto_and_listed_by_compare(plug_in):
    plug_in("crashes", _crashes)
    with pytest.raises(IndexError):
        generate("crashes", num_ranks=P, num_microbatches=M)  # called by name, the bug shows as it is
    skipped = "auto skipped generator 'crashes', which failed: IndexError: list index"
    with pytest.warns(RuntimeWarning, match=skipped):
        chosen = generate("auto", num_ranks=P, num_microbatches=M)
    assert chosen.name != "crashes" and chosen.num_microbatches == M
    with pytest.warns(RuntimeWarning):  # compare's auto row
        ran, refused = compare_rows(P, M, None, None)
    assert dict(refused)["crashes"] == "generator 'crashes' failed: IndexError: list index out of range"
    assert "1f1b" in dict(ran)


def test_auto_names_a_failed_generator_when_nothing_fits(plug_in):
    plug_in("crashes", _crashes)
    named = "generator 'crashes' failed: IndexError"
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match=named):
        generate("auto", num_ranks=P, num_microbatches=M, memory_limit=0.5)


def test_an_interrupt_is_not_swallowed(plug_in):
    def interrupted(*, num_ranks, num_microbatches, costs, memory_limit):
        raise KeyboardInterrupt

    plug_in("interrupted", interrupted)
    with pytest.raises(KeyboardInterrupt):
        generate("auto", num_ranks=P, num_microbatches=M)
    with pytest.raises(KeyboardInterrupt):
        compare_rows(P, M, None, None)


def test_registering_before_the_built_ins_load_keeps_them_all():
    """In a fresh interpreter (this one has loaded the built-ins): a taken name is refused at the user's
    decorator, and every built-in stays registered (the collision used to stop their import half-way)."""
    script = textwrap.dedent("""
        from bubbleless_schedules import available, generate, register
        try:
            @register("1f1b")
            def mine(**options): ...
        except ValueError as exc:
            print("refused:", exc)

        @register("mine")
        def mine(*, num_ranks, num_microbatches, costs, memory_limit):
            return generate("1f1b", num_ranks=num_ranks, num_microbatches=num_microbatches)

        print(",".join(available()))
        print(generate("mine", num_ranks=2, num_microbatches=2).num_microbatches)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    refused, names, microbatches = out.splitlines()
    assert refused == "refused: a schedule named '1f1b' is already registered"
    assert names.split(",") == [*available(), "mine"]
    assert microbatches == "2"
