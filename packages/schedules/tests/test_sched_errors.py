"""Bad input raises ValueError that says what to change, for every registered generator."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Costs, available, generate, simulate, validate

NAMES = available()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("ranks", [0, -1, 2.5, True, "4"])
def test_ranks_must_be_a_positive_integer(name, ranks):
    with pytest.raises(ValueError, match="num_ranks must be an integer >= 1"):
        generate(name, num_ranks=ranks, num_microbatches=4)


@pytest.mark.parametrize("name", NAMES)
def test_zero_microbatches_are_refused(name):
    with pytest.raises(ValueError, match="num_microbatches must be an integer >= 1"):
        generate(name, num_ranks=2, num_microbatches=0)


@pytest.mark.parametrize("name", NAMES)
def test_too_few_microbatches_either_work_or_say_how_many_are_needed(name):
    """Some schedules need m >= p (or a multiple of p); those must say so, naming the micro-batches."""
    p = 4
    for m in range(1, 2 * p + 1):
        try:
            validate(generate(name, num_ranks=p, num_microbatches=m))
        except ValueError as exc:
            text = str(exc).lower()
            assert "micro" in text or "num_microbatches" in text, f"{name} m={m}: {exc}"
            assert any(ch.isdigit() for ch in text), f"{name} m={m}: the message should give the number: {exc}"


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="unknown schedule 'zero-bubble-9000'") as info:
        generate("zero-bubble-9000", num_ranks=2, num_microbatches=2)
    for name in NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_memory_limit_below_any_schedule_says_to_raise_it(name):
    """Every schedule holds at least one micro-batch's share on some rank (1/v M_B, v <= 8 here)."""
    with pytest.raises(ValueError) as info:
        generate(name, num_ranks=4, num_microbatches=8, memory_limit=0.1)
    text = str(info.value).lower()
    assert "memory" in text or "limit" in text, f"{name}: {info.value}"


@pytest.mark.parametrize("limit", [0, -1.0])
def test_memory_limit_must_be_positive(limit):
    with pytest.raises(ValueError, match="memory_limit is in M_B and must be positive"):
        generate("1f1b", num_ranks=2, num_microbatches=2, memory_limit=limit)


def test_gpipe_over_the_limit_names_the_peak_and_the_way_out():
    with pytest.raises(ValueError, match="needs 8 M_B.*raise the limit to at least 8"):
        generate("gpipe", num_ranks=2, num_microbatches=8, memory_limit=4)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Costs(-1.0, 1, 1), "Costs.forward must be non-negative"),
        (lambda: Costs(1, float("nan"), 1), "Costs.backward_input must be non-negative"),
        (lambda: Costs([], 1, 1), "empty sequence"),
        (lambda: Costs.parse("1,2"), "--costs takes F,I,W or F,I,W,C"),
        (lambda: Costs.parse("a,b,c"), "--costs takes F,I,W or F,I,W,C"),
        (lambda: generate("1f1b", num_ranks=2, num_microbatches=2, costs="1,1,1"), "costs must be"),
        (lambda: simulate(generate("1f1b", num_ranks=2, num_microbatches=2), Costs([1, 1, 1], 1, 1)),
         "costs give 3 per-stage values but the schedule has 2 stages"),
        (lambda: Costs([1, 2], [1, 2, 3], 1).num_stages_given(), "differ in length"),
        (lambda: simulate(generate("1f1b", num_ranks=2, num_microbatches=2), input_grad_frees=2), "within"),
    ],
)
def test_bad_costs_and_options(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_comm_must_be_one_number():
    with pytest.raises(ValueError, match="comm must be one number"):
        Costs(1.0, 1.0, 1.0, [0.1, 0.2])


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb", "roundrobin", "auto"])
def test_unknown_option_is_refused_naming_the_accepted_ones(name):
    with pytest.raises(ValueError, match=r"takes no option chunk_per_rank; its options are: .*input_grad_frees"):
        generate(name, num_ranks=2, num_microbatches=4, chunk_per_rank=3)


def test_input_grad_frees_is_checked_once_for_every_generator():
    with pytest.raises(ValueError, match=r"input_grad_frees is a fraction within \[0, 1\]"):
        generate("1f1b", num_ranks=2, num_microbatches=4, input_grad_frees=1.5)


def test_empty_csv_text_is_a_value_error_not_a_directory_read():
    from bubbleless_schedules import Schedule

    with pytest.raises(ValueError, match="must start with"):
        Schedule.from_csv("")
