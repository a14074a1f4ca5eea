"""``fedhv table`` / ``fedhv plot`` on damaged run trees: damaged runs and lines are skipped
and named, the rest is still tabulated; ``null`` numbers read as missing; a missing
matplotlib is one ``error:`` line with the install command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.results.collect import find_runs
from fedhv.results.plots import make_figures
from fedhv.results.table_model import RENDERERS
from fedhv.results.tables import build_tables

pytestmark = pytest.mark.needs_data  # every test here reads the real data


@pytest.fixture(scope="module")
def grid(small_grid: Path) -> Path:
    """The session's small grid (``conftest.small_grid``); tests only read it."""
    return small_grid


@pytest.fixture
def tree(grid: Path, tmp_path: Path) -> Path:
    """A private copy of the grid to damage."""
    return Path(shutil.copytree(grid, tmp_path / "tree"))


def fedhv(*args: str, code: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``fedhv ARGS`` in a real process (``code``: run it through ``python -c`` instead)."""
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "fedhv.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def test_torn_line_in_the_middle_is_skipped_and_later_records_kept(tree: Path) -> None:
    run = tree / "multimnist" / "fedhv" / "s0"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    lines[1] = lines[1][: len(lines[1]) // 2]  # torn in the middle of the file
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    proc = fedhv("table", str(tree), "--table", "11")
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc.stderr) == [f"warning: skipped {run}/metrics.jsonl line 2: not valid JSON"]
    assert "Table 11" in proc.stdout and "Traceback" not in proc.stderr
    runs = {(r.method, r.seed): r for r in find_runs(tree)[0]}
    assert [e["round"] for e in runs[("fedhv", 0)].metrics] == [1, 3]  # round 3 was dropped before


DAMAGES = {
    "summary-truncated": ("summary.json", b'{"mean_acc": 1, '),
    "summary-not-utf8": ("summary.json", b'{"setting": "caf\xe9"}'),
    "summary-not-an-object": ("summary.json", b"[]"),
    "summary-wrong-type": ("summary.json", b'{"setting": "multimnist", "method": "fedhv", "mean_acc": "high"}'),
    "summary-too-deep": ("summary.json", b"[" * 100_000 + b"]" * 100_000),
    "config-not-toml": ("config.toml", b"seed = = 3\n"),
    "config-not-utf8": ("config.toml", b'setting = "caf\xe9"\n'),
    "config-wrong-type": ("config.toml", b'setting = "multimnist"\n[eval]\ntest_period = "3"\n'),
    "grid-job-garbage": ("grid-job.json", b'{"variant": {"a": 1}}'),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_run_is_skipped_with_its_path_and_the_rest_tabulated(tree: Path, damage: str) -> None:
    name, content = DAMAGES[damage]
    bad = tree / "multimnist" / "fedhv" / "s1" / name
    bad.write_bytes(content)
    proc = fedhv("table", str(tree), "--table", "1,9,11,7,13", "--paper")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (warning,) = warnings_of(proc.stderr)
    assert warning.startswith(f"warning: skipped {bad}: ") and warning.endswith("(run left out)"), warning
    assert "FedHV" in proc.stdout and "(1 seed)" in proc.stdout  # FedHV from its undamaged seed only
    assert "Uniform" in proc.stdout and "Table 13" in proc.stdout


def _nullify(run: Path) -> None:
    """Store every float of the run as null, as the writers do for NaN / inf."""
    def strip(value: object) -> object:
        if isinstance(value, float):
            return None
        if isinstance(value, list):
            return [strip(v) for v in value]
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        return value

    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(strip(summary)))
    for name in ("metrics.jsonl", "rounds.jsonl"):
        records = [strip(json.loads(line)) for line in (run / name).read_text().splitlines()]
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_null_numbers_read_as_missing_in_every_table_and_figure(tree: Path, tmp_path: Path) -> None:
    _nullify(tree / "multimnist" / "fedhv" / "s0")
    _nullify(tree / "multimnist" / "uniform" / "s1")
    runs, _ = find_runs(tree)
    assert len(runs) == 4
    tables = build_tables(runs, paper=True)
    assert [t.key for t in tables] == ["1", "8", "9", "11", "7", "12", "13"]
    for table in tables:
        for render in RENDERERS.values():
            render(table)
    table1 = RENDERERS["markdown"](tables[0])
    assert table1.count("(1 seed)") == 4  # each method's mean is over its one non-null seed
    files = make_figures(runs, tmp_path / "fig", ["png"])
    assert len(files) == 5 and all(f.stat().st_size > 10_000 for f in files)


BLOCKERS = {
    "sys.modules": "import sys; sys.modules['matplotlib'] = None\n",
    "broken-package": None,  # a `matplotlib` package on PYTHONPATH whose import raises ImportError
}


@pytest.mark.parametrize("blocker", list(BLOCKERS))
def test_plot_without_matplotlib_says_how_to_install_it(grid: Path, tmp_path: Path, blocker: str) -> None:
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is broken here')\n")
    out = tmp_path / "fig"
    call = f"from fedhv.cli import main; sys.exit(main(['plot', {str(grid)!r}, '--out', {str(out)!r}]))"
    if blocker == "sys.modules":
        proc = fedhv(code=BLOCKERS[blocker] + call)
    else:
        pythonpath = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
        proc = fedhv(code="import sys\n" + call, env={"PYTHONPATH": pythonpath})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: fedhv plot needs matplotlib")
    assert "pip install 'fedhv[plot]'" in proc.stderr
    assert not out.exists()


def test_plot_rejects_unknown_formats_and_unwritable_folders(grid: Path, tmp_path: Path) -> None:
    proc = fedhv("plot", str(grid), "--out", str(tmp_path / "fig"), "--formats", "png,xyz")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: --formats xyz: not a figure format; choose from ")
    assert not (tmp_path / "fig").exists()  # refused before drawing anything
    (tmp_path / "file").write_text("")
    proc = fedhv("plot", str(grid), "--out", str(tmp_path / "file" / "fig"), "--formats", "png")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: --out {tmp_path / 'file' / 'fig'}: cannot write figures there")
