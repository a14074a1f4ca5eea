"""Issue 16, outputs: LaTeX that compiles as emitted, tidy CSV, honest notes and Δ rows,
paper-ready figures (integer round ticks, markers, sizes, one colour per method, paper
figure numbers) and the CLI conveniences (--version, presets, case-insensitive methods)."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import shutil
import subprocess
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from fedhv.cli import main
from fedhv.config import preset_names
from fedhv.config.loader import build, load_setting, to_dict
from fedhv.config.schema import RunConfig
from fedhv.results.collect import Run, find_runs
from fedhv.results.tables import build_tables

from conftest import SMALL
from helpers import cli as fedhv  # fedhv.cli.main in this process

SETS = [a for o in SMALL for a in ("--set", o)]
CSV_HEADER = ("table", "setting", "method", "metric", "mean", "std", "n_seeds", "paper_mean", "paper_std")


@pytest.fixture(scope="module")
def grid(small_grid: Path) -> Path:
    """The session's small grid (``conftest.small_grid``); tests only read it."""
    return small_grid


@pytest.fixture(scope="module")
def runs(grid: Path) -> list[Run]:
    return find_runs(grid)[0]




# ---------------------------------------------------------------------------------------------- LaTeX


def _check_tex_structure(tex: str) -> None:
    """Pure ASCII, balanced braces and environments, math shifts paired on every line."""
    bad = sorted({ch for ch in tex if not ch.isascii()})
    assert not bad, f"non-ASCII characters in the LaTeX: {bad}"
    body = "\n".join(line.split("%", 1)[0] if not line.startswith("%") else "" for line in
                     tex.replace("\\%", "").splitlines())
    unescaped = body.replace("\\{", "").replace("\\}", "").replace("\\$", "")
    depth = 0
    for ch in unescaped:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0, "a '}' closes nothing"
    assert depth == 0, "unbalanced braces"
    stack: list[str] = []
    for kind, env in re.findall(r"\\(begin|end)\{(\w+)\}", unescaped):
        if kind == "begin":
            stack.append(env)
        else:
            assert stack and stack.pop() == env, f"\\end{{{env}}} does not close the open environment"
    assert not stack, f"unclosed environments {stack}"
    for line in unescaped.splitlines():
        assert line.count("$") % 2 == 0, f"unpaired math shift in {line!r}"


@pytest.mark.needs_data
def test_latex_is_ascii_balanced_with_the_caption_once_and_compiles(grid: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", str(grid), "--format", "latex", "--paper"]) == 0
    tex = capsys.readouterr().out
    _check_tex_structure(tex)
    captions = re.findall(r"\\caption\{(.*)\}", tex)
    assert len(captions) == tex.count("\\begin{table}") == 7  # 1, 8, 9, 11, 7, 12, 13
    for caption in captions:
        assert not caption.startswith("Table"), caption  # LaTeX numbers the caption itself
        assert tex.count(caption) == 1
    assert "\\caption{final MeanAcc and WorstAcc (\\%), mean $\\pm$ sample std over seeds}" in tex
    assert "MeanAcc $\\uparrow$" in tex and "MeanLoss $\\downarrow$" in tex
    assert tex.count("needs \\usepackage{booktabs}") == tex.count("\\begin{table}")
    labels = re.findall(r"\\label\{([^}]*)\}", tex)
    assert len(labels) == len(set(labels))  # Tables 9 and 13 have one table per setting
    engine = shutil.which("pdflatex")
    if engine:  # compile it as emitted
        doc = "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n" + tex + "\\end{document}\n"
        (tmp_path / "t.tex").write_text(doc, encoding="ascii")
        proc = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", "t.tex"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:]


# ---------------------------------------------------------------------------------------------- CSV


@pytest.mark.needs_data
def test_csv_is_tidy_long_format_with_one_header(grid: Path, runs: list[Run],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", str(grid), "--format", "csv", "--paper"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == ",".join(CSV_HEADER)
    assert text.count("table,setting,method") == 1  # one header for every table
    rows = list(csv.DictReader(io.StringIO(text)))
    assert all(list(r) == list(CSV_HEADER) and None not in r.values() for r in rows)
    assert {r["table"] for r in rows} == {"1", "8", "9", "11", "7", "12", "13"}
    by_key = {(r["table"], r["setting"], r["method"], r["metric"]): r for r in rows}
    assert len(by_key) == len(rows)  # one row per (table, setting, method, metric)
    for method in ("uniform", "fedhv"):
        for key in ("mean_acc", "worst_acc"):
            values = [r.summary[key] for r in runs if r.method == method]
            row = by_key[("1", "multimnist", method, key)]
            assert float(row["mean"]) == pytest.approx(sum(values) / 2, abs=1e-12)
            assert float(row["std"]) == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5, abs=1e-12)
            assert row["n_seeds"] == "2"
    assert (by_key[("1", "multimnist", "fedhv", "mean_acc")]["paper_mean"],
            by_key[("1", "multimnist", "fedhv", "mean_acc")]["paper_std"]) == ("90.72", "0.65")
    left = by_key[("9", "multimnist", "fedhv", "task_acc[left]")]
    assert float(left["mean"]) == pytest.approx(sum(r.summary["task_acc"][0] for r in runs if r.method == "fedhv") / 2)
    assert by_key[("9", "multimnist", "uniform", "task_acc[left]")]["paper_mean"] == ""  # no Uniform in Table 9
    assert by_key[("7", "multimnist", "fedhv", "floor_checks")]["paper_mean"] == "1200.0"
    try:
        import pandas as pd
    except ImportError:
        return
    frame = pd.read_csv(io.StringIO(text))
    assert list(frame.columns) == list(CSV_HEADER) and len(frame) == len(rows)


@pytest.mark.needs_data
def test_table_out_writes_one_file_per_table(grid: Path, tmp_path: Path) -> None:
    proc = fedhv("table", str(grid), "--format", "csv", "--out", str(tmp_path / "csv"))
    assert proc.returncode == 0, proc.stderr
    names = ["table1.csv", "table8.csv", "table9.csv", "table11.csv", "table7.csv", "table12.csv", "table13.csv"]
    assert proc.stdout.splitlines() == [str(tmp_path / "csv" / n) for n in names]
    for name in names:
        lines = (tmp_path / "csv" / name).read_text().splitlines()
        assert lines[0] == ",".join(CSV_HEADER) and all(not ln.startswith("table,") for ln in lines[1:])
        assert {ln.split(",")[0] for ln in lines[1:]} == {name[5:-4]}
    proc = fedhv("table", str(grid), "--table", "1,9", "--format", "latex", "--out", str(tmp_path / "tex"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "tex").iterdir()) == ["table1.tex", "table9.tex"]
    _check_tex_structure((tmp_path / "tex" / "table9.tex").read_text())


# ---------------------------------------------------------------------------------------------- notes, Δ


def _as_paper_setting(runs: list[Run]) -> list[Run]:
    """The runs with the paper's configuration of their setting (the preset, defaults filled in)."""
    preset = to_dict(build(RunConfig, load_setting("multimnist")))
    return [dataclasses.replace(r, config={**preset, "method": r.method, "seed": r.seed}) for r in runs]


@pytest.mark.needs_data
def test_paper_delta_is_flagged_when_the_runs_setting_differs(grid: Path, runs: list[Run],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", str(grid), "--table", "1", "--paper"]) == 0
    captured = capsys.readouterr()
    assert "| paper | 90.17 ± 0.18 | 88.14 ± 0.34 | 90.72 ± 0.65 | 88.94 ± 0.61 |" in captured.out
    assert "Δ (ours − paper)" not in captured.out
    assert "| Δ n/a: setting differs | n/a | n/a | n/a | n/a |" in captured.out
    assert "rounds = 3 (paper 200)" in captured.out and "train.clients_per_round = 4 (paper 20)" in captured.out
    assert captured.err.startswith("note: --paper: multimnist: the runs differ from the paper's setting (rounds = 3")
    # the same runs under the paper's setting get their difference row
    (t1,) = build_tables(_as_paper_setting(runs), ["1"], paper=True)
    delta = [cells for labels, cells in zip(t1.labels, t1.rows) if labels[-1] == "Δ (ours − paper)"]
    fedhv_acc = sum(r.summary["mean_acc"] for r in runs if r.method == "fedhv") / 2
    assert len(delta) == 1 and delta[0][2].text == f"{fedhv_acc - 90.72:+.2f}" and not t1.warnings


@pytest.mark.needs_data
def test_notes_say_what_tables_9_and_11_hold(runs: list[Run]) -> None:
    t9, t11 = build_tables(runs, ["9", "11"])
    assert ("No best / second-best marks: the paper ranks FSMGDA, FedCMOO and FedHV, and these runs have only FedHV "
            "of them.") in t9.notes
    assert not any(c.mark for row in t9.rows for c in row)
    assert t11.title == "Table 11: MeanAcc averaged over the final 3 scheduled test evaluations"
    assert ("These runs have only 3 scheduled test evaluations, so each value averages 3 evaluations, not the "
            "paper's final ten.") in t11.notes
    # with two of the paper's ranked methods, the note names them and who is not ranked
    relabelled = [dataclasses.replace(r, summary={**r.summary, "method": "fsmgda"}) if r.method == "uniform" else r
                  for r in runs]
    (t9,) = build_tables(relabelled, ["9"])
    assert ("Bold: best, underlined: second best among FSMGDA, FedHV (the paper ranks FSMGDA, FedCMOO and FedHV), "
            "on unrounded means.") in t9.notes


# ---------------------------------------------------------------------------------------------- figures


@pytest.fixture
def figures(runs: list[Run]) -> Iterator[Any]:
    """``figures(runs, size)``: every figure as {stem: Figure}; all are closed afterwards."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from fedhv.results.plots import build_figures

    made: list[Any] = []

    def build(rs: list[Run], size: str = "page") -> dict[str, Any]:
        figs = dict(build_figures(rs, size=size) if size != "page" else build_figures(rs))
        made.extend(figs.values())
        return figs

    yield build
    for fig in made:
        plt.close(fig)


@pytest.mark.needs_data
def test_round_axes_have_integer_ticks_and_sparse_curves_markers(runs: list[Run], figures: Any) -> None:
    for stem, fig in figures(runs).items():
        if "bars-" in stem:  # final per-task bars (Figure 2): tasks on the x axis
            continue
        fig.canvas.draw()
        assert any(ax.get_xlabel() == "round" for ax in fig.axes), stem
        for ax in fig.axes:  # every figure plots against the round
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]
            assert ticks and all(float(t).is_integer() for t in ticks), (stem, ticks)
            for line in ax.get_lines():
                if len(line.get_xdata()) > 2:  # data curves (3 or 4 points), not the 1/m guide
                    assert line.get_marker() == "o", (stem, line.get_label())


@pytest.mark.needs_data
def test_figure_width_per_size(runs: list[Run], figures: Any) -> None:
    for size, width in (("column", 3.3), ("page", 6.9)):
        for stem, fig in figures(runs, size).items():
            assert fig.get_figwidth() == pytest.approx(width), (size, stem)


@pytest.mark.needs_data
def test_each_method_has_one_colour_in_every_figure(runs: list[Run], figures: Any) -> None:
    # Two methods of the user's ("mymethod", "othermethod": Uniform's and FedHV's runs relabelled) on
    # MultiMNIST, and "othermethod" alone on a second setting: its colour must not depend on the figure.
    names = {"uniform": "mymethod", "fedhv": "othermethod"}
    mixed = [dataclasses.replace(r, summary={**r.summary, "method": names[r.method]}) for r in runs]
    mixed += [dataclasses.replace(r, summary={**r.summary, "setting": "mnist-fmnist"}) for r in mixed
              if r.method == "othermethod"]
    colours: dict[str, set[str]] = {}
    for stem, fig in figures(mixed).items():
        if stem.startswith(("curves-", "tasks-", "wallclock-")):
            for ax in fig.axes:
                for line in ax.get_lines():
                    colours.setdefault(line.get_label().split(" (incl.")[0], set()).add(line.get_color())
    assert set(colours) == {"mymethod", "othermethod"}
    assert all(len(c) == 1 for c in colours.values()), colours
    assert colours["mymethod"] != colours["othermethod"]
    from fedhv.results.plots import COLORS, method_color

    assert all(method_color(m) == c for m, c in COLORS.items())  # the paper's four keep their colours
    assert set.union(*colours.values()).isdisjoint(COLORS.values())  # not confused with one of them


@pytest.mark.needs_data
def test_paper_figure_20_is_named_after_its_number(runs: list[Run], figures: Any) -> None:
    relabelled = [dataclasses.replace(r, summary={**r.summary, "setting": "cifar10-mnist-b"}) for r in runs]
    assert list(figures(relabelled)) == ["curves-cifar10-mnist-b", "tasks-cifar10-mnist-b", "weights-cifar10-mnist-b",
                                         "fig20-wallclock-cifar10-mnist-b", "fig2-bars-cifar10-mnist-b"]


# ---------------------------------------------------------------------------------------------- CLI


def test_version_and_one_line_preset_descriptions() -> None:
    proc = fedhv("--version")
    assert proc.returncode == 0 and proc.stdout == f"fedhv {version('fedhv')}\n", proc.stderr
    proc = fedhv("presets")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == preset_names()
    assert ("multimnist       multimnist, alpha = 0.15 all-label, N = 30 x 600 samples, M = 20 per round, 200 rounds, "
            "batch 32, K = 10, test every 3 rounds") in lines


@pytest.mark.needs_data
def test_method_names_are_case_insensitive(tmp_path: Path) -> None:
    proc = fedhv("show-config", "multimnist", "--method", "FedCMOO")
    assert proc.returncode == 0, proc.stderr
    assert 'method = "fedcmoo"' in proc.stdout and "lr_local = 0.5" in proc.stdout  # FedCMOO's Table 5 rate
    proc = fedhv("show-config", "multimnist", "--set", "method=Uniform")
    assert proc.returncode == 0 and 'method = "uniform"' in proc.stdout, proc.stderr
    proc = fedhv("grid", "multimnist", "--methods", "FedHV", "--seeds", "0", "--rounds", "1", "--out",
                 str(tmp_path / "g"), "--workers", "1", "--threads", "1", "--quiet", *SETS)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "g" / "multimnist" / "fedhv" / "s0" / "summary.json").is_file()
