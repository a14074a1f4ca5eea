"""A small table model with best / second-best marks, rendered as Markdown, LaTeX or CSV.

- Markdown: the table as shown in a terminal or a notebook.
- LaTeX: pure ASCII that compiles with pdflatex as emitted (``booktabs`` needed); the
  caption is the title without its "Table N:" prefix (LaTeX numbers captions itself).
- CSV: tidy long format, one row per (table, setting, method, metric) with our mean,
  std and seed count and the paper's mean and std, one header for any number of tables.
"""

from __future__ import annotations

import csv
import io
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedhv import safe_io
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


@dataclass(frozen=True)
class Record:
    """One tidy value of a table: ours (mean, std, seeds) and the paper's, for the CSV output.

    ``setting`` and ``method`` are the raw names (``multimnist``, ``fedhv``); ``metric`` a
    key such as ``mean_acc`` or ``task_acc[left]``.
    """

    setting: str
    method: str
    metric: str
    ours: Stat | None
    paper: Stat | None = None


@dataclass
class Table:
    """A rendered paper table.

    ``rows`` hold the cells of each row after the row labels (``labels``); ``records`` the
    same values in long form (:class:`Record`); ``warnings`` lines for the user (stderr);
    ``slug`` tells apart tables of one number (Table 9 per setting) in LaTeX labels.
    """

    key: str
    title: str
    label_header: list[str]
    header: list[str]
    labels: list[list[str]] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    slug: str = ""

    def add(self, labels: Sequence[str], cells: Sequence[Cell]) -> int:
        self.labels.append(list(labels))
        self.rows.append(list(cells))
        return len(self.rows) - 1

    def note(self, text: str) -> None:
        """Append ``text`` to the notes unless it is already there."""
        if text not in self.notes:
            self.notes.append(text)

    @property
    def caption(self) -> str:
        """The title without its ``Table N:`` prefix (LaTeX's ``\\caption`` adds its own)."""
        return re.sub(r"^Table\s+\S+:\s*", "", self.title)


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


#: Non-ASCII characters the tables use, as LaTeX that compiles with pdflatex (no extra package).
TEX_SYMBOLS: dict[str, str] = {
    "±": "$\\pm$", "–": "--", "—": "---", "−": "$-$", "Δ": "$\\Delta$", "≤": "$\\le$", "≥": "$\\ge$",
    "↑": "$\\uparrow$", "↓": "$\\downarrow$", "·": "$\\cdot$", "×": "$\\times$", "α": "$\\alpha$",
    "ρ": "$\\rho$", "δ": "$\\delta$", "η": "$\\eta$", "θ": "$\\theta$", "Π": "$\\Pi$", "Σ": "$\\Sigma$",
    "σ": "$\\sigma$", "≈": "$\\approx$", "…": "\\ldots{}", "’": "'", "‘": "`", "“": "``", "”": "''",
    "ᵗ": "\\textsuperscript{t}", "ℓ": "$\\ell$", "½": "$\\frac{1}{2}$", "²": "\\textsuperscript{2}",
}
_TEX_ASCII = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "$": "\\$",
              "{": "\\{", "}": "\\}", "^": "\\textasciicircum{}", "~": "\\textasciitilde{}", "<": "$<$",
              ">": "$>$", "|": "$|$"}


def _tex_char(ch: str) -> str:
    """One character as pdflatex-safe ASCII: escaped specials, math symbols, else accents dropped."""
    if ch in _TEX_ASCII:
        return _TEX_ASCII[ch]
    if ch.isascii():
        return ch
    if ch in TEX_SYMBOLS:
        return TEX_SYMBOLS[ch]
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode("ascii")
    return plain or "?"


def _tex(text: str) -> str:
    """``text`` as pure-ASCII LaTeX (specials escaped, Unicode symbols in math mode)."""
    return "".join(_tex_char(ch) for ch in text)


def _tex_comment(text: str) -> str:
    """``text`` as the ASCII body of a ``%`` comment line."""
    return "".join(ch if ch.isascii() else TEX_SYMBOLS.get(ch, "?").replace("$", "") for ch in text)


def to_latex(table: Table) -> str:
    """A ``table`` environment that pdflatex compiles as emitted (with ``\\usepackage{booktabs}``).

    Pure ASCII: Unicode symbols (↑, −, ±, α, ...) become math-mode commands, LaTeX's
    special characters are escaped, and the notes are ``%`` comments after the tabular.
    """
    head = table.label_header + table.header
    cols = "l" * len(table.label_header) + "c" * len(table.header)
    lines = [
        "% fedhv table " + table.key + ": needs \\usepackage{booktabs} (\\toprule, \\midrule, \\bottomrule)",
        "\\begin{table}[t]", "\\centering", f"\\caption{{{_tex(table.caption)}}}",
        f"\\label{{tab:fedhv-{table.key}{'-' + table.slug if table.slug else ''}}}", f"\\begin{{tabular}}{{{cols}}}",
        "\\toprule", " & ".join(_tex(h) for h in head) + " \\\\", "\\midrule",
    ]
    for labels, cells in zip(table.labels, table.rows):
        shown = _shown(cells, _tex, "\\textbf{{{}}}", "\\underline{{{}}}")
        lines.append(" & ".join([_tex(x) for x in labels] + shown) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"% {_tex_comment(n)}" for n in table.notes]
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


#: The CSV columns (tidy long format).
CSV_HEADER: tuple[str, ...] = ("table", "setting", "method", "metric", "mean", "std", "n_seeds", "paper_mean",
                               "paper_std")


def _num(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def to_csv(tables: Table | Sequence[Table]) -> str:
    """All values of ``tables`` in tidy long format under one header (:data:`CSV_HEADER`).

    One row per :class:`Record`: ``table`` is the paper's table number, ``mean`` / ``std``
    are over ``n_seeds`` seeds (``std`` empty for one seed), ``paper_mean`` / ``paper_std``
    the published value (empty where the paper has none). Numbers are written unrounded.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for table in [tables] if isinstance(tables, Table) else tables:
        for r in table.records:
            ours = [_num(r.ours.mean), _num(r.ours.std), str(r.ours.n)] if r.ours is not None else ["", "", ""]
            paper = [_num(r.paper.mean), _num(r.paper.std)] if r.paper is not None else ["", ""]
            writer.writerow([table.key, r.setting, r.method, r.metric, *ours, *paper])
    return buf.getvalue()


def render(tables: Sequence[Table], fmt: str) -> str:
    """``tables`` in format ``fmt`` (``markdown``, ``latex`` or ``csv``) as one text."""
    if fmt == "csv":
        return to_csv(tables)
    return "\n".join(RENDERERS[fmt](t) for t in tables)


#: File extension per format for ``fedhv table --out``.
EXTENSIONS: dict[str, str] = {"markdown": "md", "latex": "tex", "csv": "csv"}


def write_tables(tables: Sequence[Table], fmt: str, out: str | Path) -> list[Path]:
    """One file per paper table number in folder ``out`` (``table1.md``, ``table9.tex``, ...).

    Tables sharing a number (Table 9 and 13 per setting) go into the same file; each CSV
    file has one header. Returns the files written, in table order.
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    by_key: dict[str, list[Table]] = {}
    for t in tables:
        by_key.setdefault(t.key, []).append(t)
    files = []
    for key, members in by_key.items():
        path = folder / f"table{key}.{EXTENSIONS[fmt]}"
        # Exclusive temporary file + rename: a link or FIFO planted in the folder is refused, never written through.
        safe_io.write_atomic_bytes(path, render(members, fmt).encode("utf-8"))
        files.append(path)
    return files


RENDERERS: dict[str, Callable[[Table], str]] = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv}
