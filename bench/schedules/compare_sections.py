"""Recompute some of the schedule report's sections in place, keeping the others as they were run.

    python -m bench.schedules.compare_sections d h        # rewrites (d) and (h) in bench/results/schedules.md

The whole report takes 35 CPU minutes (`compare_parallel`); after a change that can only move some
sections (the round-robin dispatch: (h); generation speed: (d)) this recomputes just those and says so
under the provenance line, naming the sections, the date and the commit, so a reader knows which figures
come from which run. Only the one-task sections (a)-(e) and (h) can be recomputed alone; the grid
sections (f) and (g) need the full report.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

SECTION_HEADING = re.compile(r"^#{2,3} \(([a-h])\) ", re.MULTILINE)
RECOMPUTED_LINE = re.compile(r"^Sections? ((?:\([a-h]\)(?:, )?)+) recomputed .*\n\n", re.MULTILINE)
NOTES_FOOTER = re.compile(r"^Notes: ", re.MULTILINE)  # what report() adds after (h) when a reference is missing
ALONE = ("a", "b", "c", "d", "e", "h")


def split_sections(text: str) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {letter: section text with its trailing blank lines})."""
    starts = [(match.start(), match.group(1)) for match in SECTION_HEADING.finditer(text)]
    if not starts:
        raise ValueError("no '### (a) ...' section headings found: is this a bench/schedules report?")
    sections = {}
    for (start, letter), (end, _) in zip(starts, starts[1:] + [(len(text), "")], strict=True):
        sections[letter] = text[start:end]
    return text[:starts[0][0]], sections


def refresh(text: str, fresh: dict[str, str], note: str) -> str:
    """The report with the sections in `fresh` replaced and `note` last under its provenance line.

    Notes of earlier recomputes stay, in order (a later one supersedes an earlier one where they share a
    section), except those whose sections are all recomputed now.
    """
    first = SECTION_HEADING.search(text)
    footer = NOTES_FOOTER.search(text, first.start()) if first else None
    body, tail = (text[:footer.start()], text[footer.start():]) if footer else (text, "")
    head, sections = split_sections(body)
    missing = sorted(set(fresh) - set(sections))
    if missing:
        raise ValueError(f"the report has no section(s) {', '.join(missing)}: regenerate it whole with "
                         "python -m bench.schedules.compare_parallel")
    for letter, body in fresh.items():
        heading = SECTION_HEADING.match(body)
        if heading is None or heading.group(1) != letter:
            raise ValueError(f"the new text for section ({letter}) does not start with its '### ({letter}) ' heading")
    for letter, body in fresh.items():  # keep the blank lines that separated the old section from the next
        old = sections[letter]
        sections[letter] = body.rstrip("\n") + old[len(old.rstrip("\n")):]
    head = RECOMPUTED_LINE.sub(lambda line: "" if set(re.findall(r"\(([a-h])\)", line.group(1))) <= set(fresh)
                               else line.group(0), head)
    head = head.rstrip("\n") + "\n\n" + note + "\n\n"
    return head + "".join(sections.values()) + tail


def _compute(letter: str) -> str:
    from bench.schedules import compare

    return {"a": compare.closed_forms, "b": lambda: compare.against_references(*compare.load_references()),
            "c": compare.heterogeneous, "d": compare.generation_time, "e": compare.published_numbers,
            "h": compare.roundrobin_section}[letter]()


def main(argv: list[str] | None = None) -> int:
    from bench.schedules import compare

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sections", nargs="+", choices=ALONE, help="section letters to recompute")
    parser.add_argument("--report", default=str(compare.RESULTS), help="the report to rewrite")
    args = parser.parse_args(argv)
    letters = sorted(set(args.sections))
    fresh = {letter: _compute(letter) for letter in letters}
    named = ", ".join(f"({letter})" for letter in letters)
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    note = (f"Section{'s' if len(letters) > 1 else ''} {named} recomputed {when} at commit {compare.commit()} by "
            f"`python -m bench.schedules.compare_sections {' '.join(letters)}`; the others are from the run above.")
    path = Path(args.report)
    path.write_text(refresh(path.read_text(), fresh, note))
    print(f"rewrote {named} in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
