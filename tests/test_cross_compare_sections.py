"""bench.schedules.compare_sections: recomputing some report sections leaves the others byte for byte."""

from __future__ import annotations

import pytest

from bench.schedules.compare_sections import refresh, split_sections

REPORT = (
    "# Schedules\n\nRun 2026-12-01 at commit abc. Memory model in (a)-(d): ...\n\n"
    "### (a) Unit costs\n\n| a |\n\n\n"
    "### (d) Generation time\n\n| old d |\n\n"
    "## (h) Round-robin\n\n| old h |\n"
)


def test_replaces_only_the_named_sections_and_notes_it():
    text = refresh(REPORT, {"h": "## (h) Round-robin\n\n| new h |\n"}, "Section (h) recomputed T1 at commit def by x.")
    _, sections = split_sections(text)
    _, before = split_sections(REPORT)
    assert sections["a"] == before["a"] and sections["d"] == before["d"]  # untouched, blank lines included
    assert "| new h |" in sections["h"] and "old h" not in text
    assert text.endswith("| new h |\n")
    head = text[: text.index("### (a)")]
    assert head.endswith("Run 2026-12-01 at commit abc. Memory model in (a)-(d): ...\n\nSection (h) recomputed T1 at commit def by x.\n\n")


def test_a_later_recompute_keeps_notes_it_does_not_cover():
    once = refresh(REPORT, {"h": "## (h) R\n\nh1\n", "d": "### (d) G\n\nd1\n"}, "Sections (d), (h) recomputed T1 by x.")
    twice = refresh(once, {"h": "## (h) R\n\nh2\n"}, "Section (h) recomputed T2 by x.")
    assert "Sections (d), (h) recomputed T1" in twice  # (d) still comes from T1
    assert twice.index("T1") < twice.index("T2")
    thrice = refresh(twice, {"d": "### (d) G\n\nd3\n", "h": "## (h) R\n\nh3\n"}, "Sections (d), (h) recomputed T3 by x.")
    assert "T1" not in thrice and "T2" not in thrice and "T3" in thrice
    assert "Memory model in (a)-(d)" in thrice


def test_refuses_what_it_cannot_splice():
    with pytest.raises(ValueError, match="no section"):
        refresh(REPORT, {"f": "### (f) grid\n"}, "n")
    with pytest.raises(ValueError, match="heading"):
        refresh(REPORT, {"d": "no heading here\n"}, "n")
    with pytest.raises(ValueError, match="headings"):
        split_sections("just text\n")


def test_keeps_the_notes_footer_after_the_last_section():
    report = REPORT + "\nNotes: zb_reference: not written yet\n"
    text = refresh(report, {"h": "## (h) Round-robin\n\n| new h |\n"}, "Section (h) recomputed T by x.")
    assert text.endswith("| new h |\n\nNotes: zb_reference: not written yet\n")
