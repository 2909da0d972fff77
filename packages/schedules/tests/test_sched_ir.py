"""The IR round-trips: actions through their text form, schedules through text and CSV; bad text is
refused with a message that says what was expected; render marks the failing step."""

from __future__ import annotations

import pytest

from bubbleless_schedules import Action, Kind, Schedule, generate, validate
from bubbleless_schedules.action import STAGE_KINDS


@pytest.mark.parametrize("kind", list(Kind))
def test_action_text_round_trip_for_every_kind(kind):
    microbatch = None if kind in STAGE_KINDS else 7
    action = Action(12, kind, microbatch)
    text = str(action)
    assert text == f"12{kind.value}" + ("" if microbatch is None else "7")
    assert Action.parse(text) == action
    assert Action.parse(f"  {text} ") == action


def test_action_examples_read_like_the_papers():
    assert str(Action(2, Kind.F, 0)) == "2F0"
    assert Action.parse("3SEND_F1") == Action(3, Kind.SEND_F, 1)
    assert Action.parse("0RECV_B10") == Action(0, Kind.RECV_B, 10)
    assert Action.parse("3LOAD") == Action(3, Kind.LOAD)
    assert Action(1, "W", 2).kind is Kind.W  # kinds given as text are normalised


@pytest.mark.parametrize("text", ["", "F0", "2X0", "-1F0", "2F0x", "2 F 0", "2f0"])
def test_action_parse_errors_say_what_is_expected(text):
    with pytest.raises(ValueError, match="expected <stage><kind><microbatch>"):
        Action.parse(text)
    with pytest.raises(ValueError, match="F needs a micro-batch"):
        Action.parse("2F")


@pytest.mark.parametrize(
    "args, message",
    [((-1, Kind.F, 0), "stage must be >= 0"), ((0, Kind.F, None), "needs a micro-batch"),
     ((0, Kind.I, -2), "needs a micro-batch"), ((0, Kind.LOAD, 1), "takes no micro-batch")],
)
def test_action_refuses_impossible_fields(args, message):
    with pytest.raises(ValueError, match=message):
        Action(*args)


def _hand_built() -> Schedule:
    """A schedule exercising what generators do not: no placement, another layout, meta, stage kinds."""
    rows = [
        [Action(0, Kind.LOAD), Action(0, Kind.F, 0), Action(0, Kind.STORE)],
        [Action(1, Kind.LOAD), Action(1, Kind.R, 0), Action(1, Kind.I, 0), Action(1, Kind.W, 0)],
    ]
    return Schedule(rows, num_stages=2, num_microbatches=1, name="hand-made", layout="roundrobin",
                    meta={"forward_groups": (0, 1), "devices": 2})


def _idle_rank_first() -> Schedule:
    """A pipeline schedule whose rank 0 holds no stage: its row is empty."""
    return Schedule([[], [Action(0, Kind.F, 0), Action(0, Kind.B, 0)]], num_stages=1, num_microbatches=1,
                    stage_to_rank=(1,))


@pytest.mark.parametrize("make", [
    lambda: generate("1f1b", num_ranks=3, num_microbatches=5),
    lambda: generate("gpipe", num_ranks=1, num_microbatches=1),
    _hand_built,
    lambda: generate("roundrobin", num_ranks=8, num_microbatches=1, num_layers=2),  # devices 3..7 idle
    _idle_rank_first,
])
def test_schedule_text_and_csv_round_trip(make, tmp_path):
    schedule = make()
    assert Schedule.from_text(schedule.to_text()) == schedule
    assert Schedule.from_text(str(schedule)) == schedule
    assert Schedule.from_csv(schedule.to_csv()) == schedule
    path = tmp_path / "s.csv"
    schedule.to_csv(path)
    assert Schedule.from_csv(path) == schedule
    assert Schedule.from_csv(str(path)) == schedule


def test_text_form_is_one_line_per_worker():
    text = generate("1f1b", num_ranks=2, num_microbatches=2).to_text()
    assert text == (
        "# bubbleless-schedule name=1f1b stages=2 microbatches=2 placement=0,1 layout=pipeline\n"
        "0F0 0F1 0B0 0B1\n"
        "1F0 1B0 1F1 1B1\n"
    )


def test_an_idle_worker_is_a_dash_line_and_loads_back():
    text = _idle_rank_first().to_text()
    assert text.splitlines()[1:] == ["-", "0F0 0B0"]
    reloaded = Schedule.from_text(text)
    assert reloaded.num_workers == 2 and validate(reloaded) == _idle_rank_first()


def test_text_written_by_hand_loads():
    text = """# bubbleless-schedule stages=2 microbatches=1 placement=0,1

    0F0   0I0 0W0
    1F0 1B0
    """
    schedule = Schedule.from_text(text)
    assert schedule.actions[0] == (Action(0, Kind.F, 0), Action(0, Kind.I, 0), Action(0, Kind.W, 0))
    assert schedule.stage_to_rank == (0, 1) and schedule.layout == "pipeline" and schedule.name == ""


@pytest.mark.parametrize(
    "text, message",
    [
        ("0F0 0B0\n", "must start with"),
        ("# bubbleless-schedule stages=2\n0F0\n", "needs integer stages= and microbatches="),
        ("# bubbleless-schedule stages=two microbatches=1\n0F0\n", "needs integer stages="),
        ("# bubbleless-schedule stages=1 microbatches=1 oops\n0F0\n", "expected key=value"),
        ("# bubbleless-schedule stages=1 microbatches=1\n0F0 0Q0\n", "worker 0: cannot parse action '0Q0'"),
        ("# bubbleless-schedule stages=1 microbatches=1 meta.x=a\n0F0\n", "invalid literal"),
    ],
)
def test_schedule_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        Schedule.from_text(text)


def test_csv_parse_errors_name_the_worker():
    with pytest.raises(ValueError, match="must start with"):
        Schedule.from_csv("0F0,0B0\n")
    with pytest.raises(ValueError, match="worker 1: cannot parse action 'zz'"):
        Schedule.from_csv("# bubbleless-schedule stages=2 microbatches=1\n0F0,0B0\n1F0,zz\n")


def test_render_marks_the_step_and_windows_long_schedules():
    schedule = generate("1f1b", num_ranks=2, num_microbatches=3)
    lines = schedule.render(mark=[(1, 2)]).splitlines()
    assert len(lines) == 3  # index header + one row per worker
    assert "[1F1]" in lines[2] and "[" not in lines[1]
    assert lines[1].startswith("worker 0:") and "0F0" in lines[1]

    long = generate("gpipe", num_ranks=2, num_microbatches=40)
    window = long.render(mark=[(0, 60)], width=10).splitlines()
    assert "[0B20]" in window[1]
    assert window[1].rstrip().endswith("...") and "..." in window[1][:15]
    assert "0F0" not in window[1]
