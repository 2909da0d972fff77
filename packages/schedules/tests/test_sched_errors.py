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


def test_gpipe_over_the_limit_names_the_peak_and_the_way_out():
    with pytest.raises(ValueError, match="needs 8 M_B.*raise the limit to at least 8"):
        generate("gpipe", num_ranks=2, num_microbatches=8, memory_limit=4)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Costs(-1.0, 1, 1), "Costs.forward must be finite non-negative"),
        (lambda: Costs(1, float("nan"), 1), "Costs.backward_input must be finite non-negative"),
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


# ---- issue 9: bad input to the API and the CLI says what to change ----

@pytest.mark.parametrize("field", ["forward", "backward_input", "backward_weight", "comm", "load", "recompute"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), -1.0])
def test_costs_refuse_non_finite_or_negative(field, value):
    with pytest.raises(ValueError, match=rf"Costs\.{field} must be finite non-negative numbers"):
        Costs(**{field: value})


def test_per_stage_costs_refuse_inf():
    with pytest.raises(ValueError, match=r"Costs\.forward must be finite non-negative numbers, got \[1.0, inf\]"):
        Costs(forward=[1.0, float("inf")])


@pytest.mark.parametrize("text", ["inf,1,1", "1,nan,1", "1,1,1,inf"])
def test_cli_costs_with_inf_or_nan_exit_2_naming_the_flag(text, capsys):
    from bubbleless_schedules.cli import main

    with pytest.raises(SystemExit) as info:
        main(["show", "1f1b", "-p", "2", "-m", "4", "--costs", text])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--costs '{text}'" in err and "give finite numbers" in err and "Traceback" not in err, err


@pytest.mark.parametrize("name", ["zb", "zbv", "v-half", "auto", "1f1b"])
def test_memory_limit_inf_means_no_limit(name):
    assert generate(name, num_ranks=4, num_microbatches=8, memory_limit=float("inf")) == generate(
        name, num_ranks=4, num_microbatches=8)


@pytest.mark.parametrize("limit", [float("nan"), 0, -2.0, "8", True])
def test_memory_limit_must_be_a_positive_number(limit):
    with pytest.raises(ValueError, match=r"memory_limit is in M_B and must be a positive number \(inf or None"):
        generate("zb", num_ranks=2, num_microbatches=4, memory_limit=limit)


def test_compare_with_an_infinite_memory_limit_runs_every_schedule():
    from bubbleless_schedules.cli import compare_rows

    ran, refused = compare_rows(4, 8, None, float("inf"))
    assert {name for name, _ in ran} >= {"zb", "zbv", "1f1b"}
    assert not [r for r in refused if "memory_limit" in r[1]]


def test_simulate_refuses_an_incomplete_schedule_naming_what_is_missing():
    full = generate("1f1b", num_ranks=2, num_microbatches=2)
    rows = [list(row) for row in full.actions]
    dropped = rows[1].pop()  # the last backward of the last stage
    partial = full.replace(actions=tuple(tuple(r) for r in rows))
    with pytest.raises(ValueError, match=r"incomplete schedule \(simulate needs every action") as info:
        simulate(partial)
    assert f"stage {dropped.stage}" in str(info.value) and f"micro-batch {dropped.microbatch}" in str(info.value)


@pytest.mark.parametrize("costs", [(1, 1, 1), [1.0, 1.0, 1.0], {"forward": 1}])
def test_simulate_and_generate_say_to_pass_costs(costs):
    schedule = generate("1f1b", num_ranks=2, num_microbatches=2)
    with pytest.raises(ValueError, match=r"costs must be a bubbleless_schedules.Costs.*pass Costs\(forward"):
        simulate(schedule, costs)
    with pytest.raises(ValueError, match=r"costs must be a bubbleless_schedules.Costs.*e.g. Costs\(1.0, 1.0, 1.0\)"):
        generate("1f1b", num_ranks=2, num_microbatches=2, costs=costs)


def test_from_csv_of_a_missing_file_says_it_does_not_exist(tmp_path):
    from bubbleless_schedules import Schedule

    with pytest.raises(ValueError, match=r"schedule CSV file 'missing.csv' does not exist; give the path"):
        Schedule.from_csv("missing.csv")
    with pytest.raises(ValueError, match=r"does not exist \(it is a directory\)"):
        Schedule.from_csv(str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        Schedule.from_csv(tmp_path / "nope.csv")


@pytest.mark.parametrize("command", ["show", "compare"])
@pytest.mark.parametrize("shape", [("1000", "2000"), ("300", "4"), ("64", "1024")])
def test_cli_refuses_shapes_above_its_documented_size_at_once(command, shape, capsys):
    from bubbleless_schedules.cli import MAX_RANK_MICROBATCHES, MAX_RANKS, main

    args = [command, "zb"] if command == "show" else [command]
    with pytest.raises(SystemExit) as info:
        main([*args, "-p", shape[0], "-m", shape[1]])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"at most {MAX_RANKS} ranks and {MAX_RANK_MICROBATCHES:,} ranks x micro-batches" in err, err
    assert "call bubbleless_schedules.generate from Python" in err
