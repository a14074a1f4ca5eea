"""The docs' tables that come from run records are what ``fedhv table`` prints from them.

A table in a page of ``docs/`` that was made from the records in ``docs/results`` is marked by
the command that prints it, in an HTML comment, and closed by ``<!-- end -->``::

    <!-- fedhv table docs/results/field --table ranks -->
    | Method | MeanAcc ↑ | ...
    <!-- end -->

Each such block is checked row by row (the Markdown lines starting with ``|``) against the
command's output, run in this process on the records (paths relative to the repository): a
changed record, a number edited by hand in the docs or a change in the table code that moves
a printed digit fails it.
"""

from __future__ import annotations

import re
import shlex

import pytest

from fedhv.cli import main

from conftest import REPO

MARK = re.compile(r"<!-- (fedhv table [^>]*?) -->\n(.*?)<!-- end -->", re.DOTALL)


def _blocks() -> list[tuple[str, str, str]]:
    return [(page.name, m.group(1), m.group(2)) for page in sorted((REPO / "docs").glob("*.md"))
            for m in MARK.finditer(page.read_text(encoding="utf-8"))]


BLOCKS = _blocks()


def _rows(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.startswith("|")]


def test_the_comparison_records_have_their_docs_table() -> None:
    assert any(cmd.split()[2] == "docs/results/field" for _, cmd, _ in BLOCKS), [c for _, c, _ in BLOCKS]


@pytest.mark.parametrize(("page", "command", "text"), BLOCKS, ids=[f"{p}:{c}" for p, c, _ in BLOCKS])
def test_a_docs_table_is_what_fedhv_table_prints_from_its_records(
    page: str, command: str, text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = shlex.split(command)[1:]
    assert (REPO / args[1]).is_dir(), f"{page}: {args[1]} is not a folder of records"
    monkeypatch.chdir(REPO)
    assert main(args) in (0, None)
    printed = _rows(capsys.readouterr().out)
    documented = _rows(text)
    assert documented, f"{page}: the block of `{command}` holds no table rows"
    assert documented == printed, (
        f"{page}: the table of `{command}` differs from what it prints now:\n" + "\n".join(printed))
