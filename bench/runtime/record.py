"""One results file, several generators: each rewrites only its own section.

A section is the text between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``. A file (or a section)
not there yet is created; text outside the markers, such as another script's section, is kept as is.
"""

from __future__ import annotations

import os


def write_section(path: str, name: str, text: str) -> None:
    """Put ``text`` as section ``name`` of the markdown file at ``path`` (appended when new)."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = open(path).read() if os.path.exists(path) else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block
    with open(path, "w") as f:
        f.write(new)
