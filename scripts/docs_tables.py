"""Rewrite the tables of ``docs/*.md`` that come from run records with what ``fedhv table`` prints now.

A block ``<!-- fedhv table ARGS -->`` ... ``<!-- end -->`` (tests/repo/test_results_records.py checks them)
gets the command's output without its title lines: the table rows and the notes. Run it after a change in
the table code or the records, read the diff, commit the pages::

    .venv/bin/python scripts/docs_tables.py            # every page
    .venv/bin/python scripts/docs_tables.py methods.md # one page
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

from fedhv.cli import main

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(r"(<!-- (fedhv table [^>]*?) -->\n)(.*?)(<!-- end -->)", re.DOTALL)


def printed(command: str) -> str:
    """What ``command`` prints, run in this process from the repository root, without its title lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(shlex.split(command)[1:])
    if code not in (0, None):
        raise SystemExit(f"{command}: exit status {code}")
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("**")]
    return "\n".join(lines).strip("\n")


def main_(pages: list[str]) -> int:
    os.chdir(REPO)
    targets = [REPO / "docs" / p for p in pages] or sorted((REPO / "docs").glob("*.md"))
    for page in targets:
        text = page.read_text(encoding="utf-8")
        new = MARK.sub(lambda m: f"{m.group(1)}\n{printed(m.group(2))}\n\n{m.group(4)}", text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main_(sys.argv[1:]))
