"""A schedule: one ordered action list per worker, plus where each stage runs.

Workers are ranks for stage-bound schedules (``stage_to_rank`` maps every stage to its rank) and
devices of a pool for round-robin dispatch (``stage_to_rank`` is None). ``layout`` names the dependency
rule the validator and simulator apply (see ``layouts.py``); ``meta`` carries what that rule needs.

Text form (also what ``str(schedule)`` gives)::

    # bubbleless-schedule name=1f1b stages=2 microbatches=2 placement=0,1 layout=pipeline
    0F0 0F1 0B0 0B1
    1F0 1B0 1F1 1B1

A worker with no actions (an idle pool device, a rank a hand-built schedule leaves empty) is the line
``-`` (``IDLE``), so every worker survives the round trip while blank lines stay free to ignore.

CSV form: the same header line, then one row per worker with one action per cell (an empty row when idle).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .action import Action

HEADER = "# bubbleless-schedule"
IDLE = "-"
"""The text form's line for a worker with no actions (a blank line would be skipped on reading)."""


def _freeze_meta(meta: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    frozen = {}
    for key, value in meta.items():
        if not key.isidentifier():
            raise ValueError(f"schedule meta key {key!r} must be an identifier")
        values = (value,) if isinstance(value, int) else tuple(value)
        if not all(isinstance(v, int) for v in values):
            raise ValueError(f"schedule meta {key!r} must be integers, got {value!r}")
        frozen[key] = values
    return frozen


@dataclass(frozen=True)
class Schedule:
    """Ordered actions per worker. Build one with a generator (``generate``) or by hand."""

    actions: tuple[tuple[Action, ...], ...]
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...] | None = None
    name: str = ""
    layout: str = "pipeline"
    meta: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(tuple(worker) for worker in self.actions))
        if self.stage_to_rank is not None:
            object.__setattr__(self, "stage_to_rank", tuple(self.stage_to_rank))
        object.__setattr__(self, "meta", _freeze_meta(self.meta))
        if self.name and any(ch.isspace() or ch == "=" for ch in self.name):
            raise ValueError(f"schedule name {self.name!r} must not contain spaces or '='")

    # -- shape -------------------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        """Number of workers (ranks, or pool devices for round-robin)."""
        return len(self.actions)

    @property
    def num_workers(self) -> int:
        return len(self.actions)

    @property
    def stages_per_rank(self) -> float:
        """v: how many stages each rank holds (1 for 1F1B, 2 for V shapes)."""
        return self.num_stages / self.num_ranks

    def stages_of(self, rank: int) -> list[int]:
        """Stages bound to ``rank`` in stage order (empty for round-robin schedules)."""
        if self.stage_to_rank is None:
            return []
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def all_actions(self) -> Iterable[tuple[int, int, Action]]:
        """(worker, position, action) for every action."""
        for worker, actions in enumerate(self.actions):
            for position, action in enumerate(actions):
                yield worker, position, action

    def replace(self, **changes) -> Schedule:
        fields = dict(
            actions=self.actions, num_stages=self.num_stages, num_microbatches=self.num_microbatches,
            stage_to_rank=self.stage_to_rank, name=self.name, layout=self.layout, meta=self.meta,
        )
        fields.update(changes)
        return Schedule(**fields)

    # -- text and CSV ------------------------------------------------------------------------------
    def header(self) -> str:
        parts = [HEADER]
        if self.name:
            parts.append(f"name={self.name}")
        parts.append(f"stages={self.num_stages}")
        parts.append(f"microbatches={self.num_microbatches}")
        if self.stage_to_rank is not None:
            parts.append("placement=" + ",".join(map(str, self.stage_to_rank)))
        parts.append(f"layout={self.layout}")
        for key, values in self.meta.items():
            parts.append(f"meta.{key}=" + ",".join(map(str, values)))
        return " ".join(parts)

    def to_text(self) -> str:
        lines = [self.header()]
        lines += [" ".join(str(a) for a in worker) or IDLE for worker in self.actions]
        return "\n".join(lines) + "\n"

    __str__ = to_text

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines or not lines[0].startswith(HEADER):
            raise ValueError(f"schedule text must start with a '{HEADER} ...' header line")
        rows = [[] if line.split() == [IDLE] else line.split() for line in lines[1:]]
        return cls._from_rows(lines[0], rows)

    def to_csv(self, path: str | Path | None = None) -> str:
        """CSV text (and written to ``path`` when given): the header, then one row per worker."""
        buffer = io.StringIO()
        buffer.write(self.header() + "\n")
        writer = csv.writer(buffer, lineterminator="\n")
        for worker in self.actions:
            writer.writerow([str(a) for a in worker])
        text = buffer.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_csv(cls, source: str | Path) -> Schedule:
        """Read CSV text, or a path to a CSV file (a one-line string that is not a header is a path)."""
        text = source
        if isinstance(source, Path) or (isinstance(source, str) and source and "\n" not in source
                                        and not source.startswith(HEADER)):
            if not Path(source).is_file():
                raise ValueError(
                    f"schedule CSV file {str(source)!r} does not exist"
                    + (" (it is a directory)" if Path(source).is_dir() else "")
                    + "; give the path of a file written by Schedule.to_csv, or the CSV text itself"
                )
            text = Path(source).read_text()
        lines = text.splitlines()
        if not lines or not lines[0].startswith(HEADER):
            raise ValueError(f"schedule CSV must start with a '{HEADER} ...' header line")
        rows = [[cell.strip() for cell in row if cell.strip()] for row in csv.reader(lines[1:])]
        return cls._from_rows(lines[0], rows)

    @classmethod
    def _from_rows(cls, header: str, rows: Sequence[Sequence[str]]) -> Schedule:
        fields: dict[str, str] = {}
        for token in header[len(HEADER):].split():
            key, sep, value = token.partition("=")
            if not sep:
                raise ValueError(f"bad schedule header token {token!r}: expected key=value")
            fields[key] = value
        try:
            num_stages = int(fields["stages"])
            num_microbatches = int(fields["microbatches"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"schedule header needs integer stages= and microbatches=: {header!r}") from exc
        placement = fields.get("placement")
        meta = {
            key[len("meta."):]: tuple(int(v) for v in value.split(",") if v)
            for key, value in fields.items()
            if key.startswith("meta.")
        }
        actions = []
        for worker, row in enumerate(rows):
            parsed = []
            for cell in row:
                try:
                    parsed.append(Action.parse(cell))
                except ValueError as exc:
                    raise ValueError(f"worker {worker}: {exc}") from None
            actions.append(tuple(parsed))
        return cls(
            actions=tuple(actions),
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            stage_to_rank=None if placement is None else tuple(int(r) for r in placement.split(",")),
            name=fields.get("name", ""),
            layout=fields.get("layout", "pipeline"),
            meta=meta,
        )

    # -- rendering ---------------------------------------------------------------------------------
    def render(self, mark: Iterable[tuple[int, int]] = (), width: int | None = None) -> str:
        """A grid with one row per worker; positions in ``mark`` (worker, index) are shown ``[2F0]``.

        Long schedules are windowed around the first mark so an error message stays readable.
        """
        marks = set(mark)
        longest = max((len(w) for w in self.actions), default=0)
        start, stop = 0, longest
        if width is not None and longest > width:
            centre = min((i for _, i in marks), default=0)
            start = max(0, min(centre - width // 2, longest - width))
            stop = start + width
        cell = max([len(str(a)) for _, _, a in self.all_actions()] + [3]) + 2
        label_width = len(f"worker {self.num_workers - 1}:")
        head = " " * (label_width + 1) + "".join(f"{i:^{cell}}" for i in range(start, stop))
        lines = [head]
        for worker, actions in enumerate(self.actions):
            cells = []
            for i in range(start, min(stop, len(actions))):
                text = str(actions[i])
                cells.append(f"{'[' + text + ']' if (worker, i) in marks else text:^{cell}}")
            prefix = "..." if start > 0 else ""
            suffix = " ..." if stop < len(actions) else ""
            lines.append(f"{f'worker {worker}:':<{label_width}} {prefix}{''.join(cells)}{suffix}")
        return "\n".join(lines)
