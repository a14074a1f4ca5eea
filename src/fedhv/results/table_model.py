"""A small table model with best / second-best marks, rendered as Markdown, LaTeX or CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fedhv.results.collect import Stat


@dataclass
class Cell:
    """A table cell: a statistic over seeds, or text.

    ``mark`` is ``"best"``, ``"second"`` or ``""``; ``digits`` the decimals shown.
    """

    stat: Stat | None = None
    text: str = ""
    digits: int = 2
    mark: str = ""

    def plain(self, with_std: bool = True) -> str:
        if self.stat is None:
            return self.text or "–"
        s = f"{self.stat.mean:.{self.digits}f}"
        if with_std:
            if self.stat.std is not None:
                s += f" ± {self.stat.std:.{self.digits}f}"
            elif self.stat.n == 1:
                s += " (1 seed)"
        return s


@dataclass
class Table:
    """A rendered paper table.

    ``rows`` hold the cells of each row after the row labels (``labels``).
    """

    key: str
    title: str
    label_header: list[str]
    header: list[str]
    labels: list[list[str]] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, labels: Sequence[str], cells: Sequence[Cell]) -> int:
        self.labels.append(list(labels))
        self.rows.append(list(cells))
        return len(self.rows) - 1


def rank(cells: Sequence[Cell], higher_is_better: bool) -> None:
    """Mark the best and second-best cells by their unrounded means (ties share the mark)."""
    stats = [(c.stat.mean, c) for c in cells if c.stat is not None]
    if len(stats) < 2:
        return
    values = sorted({v for v, _ in stats}, reverse=higher_is_better)
    for v, cell in stats:
        if v == values[0]:
            cell.mark = "best"
        elif len(values) > 1 and v == values[1]:
            cell.mark = "second"


def _shown(cells: Sequence[Cell], escape: Callable[[str], str], best: str, second: str) -> list[str]:
    """Cell texts, escaped and wrapped in the format's best / second-best markup (``{}`` = text)."""
    marks = {"best": best, "second": second, "": "{}"}
    return [marks[c.mark].format(escape(c.plain())) for c in cells]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(table: Table) -> str:
    head = table.label_header + table.header
    lines = [f"**{table.title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for labels, cells in zip(table.labels, table.rows):
        shown = _shown(cells, _md_escape, "**{}**", "<u>{}</u>")
        lines.append("| " + " | ".join([_md_escape(x) for x in labels] + shown) + " |")
    for note in table.notes:
        lines.append("")
        lines.append(f"_{note}_")
    return "\n".join(lines) + "\n"


def _tex(text: str) -> str:
    for a, b in (("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#"),
                 ("±", "$\\pm$"), ("–", "--"), ("Δ", "$\\Delta$"), ("≤", "$\\le$")):
        text = text.replace(a, b)
    return text


def to_latex(table: Table) -> str:
    head = table.label_header + table.header
    cols = "l" * len(table.label_header) + "c" * len(table.header)
    lines = [
        "\\begin{table}[t]", "\\centering", f"\\caption{{{_tex(table.title)}}}", f"\\begin{{tabular}}{{{cols}}}",
        "\\toprule", " & ".join(_tex(h) for h in head) + " \\\\", "\\midrule",
    ]
    for labels, cells in zip(table.labels, table.rows):
        shown = _shown(cells, _tex, "\\textbf{{{}}}", "\\underline{{{}}}")
        lines.append(" & ".join([_tex(x) for x in labels] + shown) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"% {n}" for n in table.notes]
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """One line per cell value: labels, column, mean, std, seeds, mark (machine-readable)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["table", *table.label_header, "column", "mean", "std", "n", "text", "mark"])
    for labels, cells in zip(table.labels, table.rows):
        for column, c in zip(table.header, cells):
            st = c.stat
            writer.writerow([table.key, *labels, column, "" if st is None else repr(st.mean),
                             "" if st is None or st.std is None else repr(st.std), "" if st is None else st.n,
                             c.text, c.mark])
    return buf.getvalue()


RENDERERS = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv}
