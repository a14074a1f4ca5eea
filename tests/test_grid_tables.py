"""``fedhv grid`` (shared calibration, resume, ablations) and the torch-free tables and figures."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.cli import main
from fedhv.results.collect import find_runs
from fedhv.results.table_model import to_csv, to_latex, to_markdown
from fedhv.results.tables import build_tables, table1, table10

from conftest import REPO, SMALL

SETS = [a for o in SMALL for a in ("--set", o)]


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    assert main(["grid", "multimnist", "--methods", "uniform,fedhv", "--seeds", "0,1", "--rounds", "3",
                 "--out", str(out), "--workers", "1", "--threads", "1", "--quiet", *SETS]) == 0
    assert main(["grid", "multimnist", "--methods", "fedhv", "--seeds", "0", "--rounds", "3", "--ablation",
                 "local-steps", "--out", str(out), "--workers", "1", "--threads", "1", "--quiet", *SETS]) == 0
    return out


def test_grid_layout_and_shared_calibration(grid_dir: Path) -> None:
    runs, unfinished = find_runs(grid_dir)
    assert not unfinished
    assert len(runs) == 4 + 4
    assert {r.path.relative_to(grid_dir).as_posix() for r in runs if r.variant is None} == {
        "multimnist/uniform/s0", "multimnist/uniform/s1", "multimnist/fedhv/s0", "multimnist/fedhv/s1"}
    assert (grid_dir / "multimnist" / "local_steps=20" / "fedhv" / "s0" / "summary.json").exists()
    # One calibration for the family, reused by every FedHV run (seeds and ablation variants).
    calibrations = list((grid_dir / "calibration").glob("*.json"))
    assert len(calibrations) == 1
    reference = json.loads(calibrations[0].read_text())["reference"]
    fedhv_runs = [r for r in runs if r.method == "fedhv"]
    assert all(r.summary["reference"] == reference for r in fedhv_runs)
    assert {r.config_value("train.local_steps") for r in runs if r.variant} == {1, 5, 10, 20}


def test_grid_skips_finished_and_resumes_interrupted_runs(grid_dir: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    run = grid_dir / "multimnist" / "uniform" / "s1"
    before = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    (run / "model.pt").unlink()
    argv = ["grid", "multimnist", "--methods", "uniform,fedhv", "--seeds", "0,1", "--rounds", "3",
            "--out", str(grid_dir), "--workers", "1", "--quiet", *SETS]
    assert main(argv) == 0
    assert "1 run(s) finished, 3 already done, 0 failed" in capsys.readouterr().out
    after = json.loads((run / "summary.json").read_text())
    assert after["mean_acc"] == before["mean_acc"] and after["task_loss"] == before["task_loss"]


def test_table1_is_mean_and_sample_std_of_the_runs(grid_dir: Path) -> None:
    runs, _ = find_runs(grid_dir)
    t = table1(runs)
    assert t.header == ["Uniform MeanAcc ↑", "Uniform WorstAcc ↑", "FedHV MeanAcc ↑", "FedHV WorstAcc ↑"]
    for col, (method, key) in enumerate([("uniform", "mean_acc"), ("uniform", "worst_acc"), ("fedhv", "mean_acc"),
                                         ("fedhv", "worst_acc")]):
        values = [r.summary[key] for r in runs if r.method == method and r.variant is None]
        cell = t.rows[0][col]
        assert cell.stat is not None
        assert cell.stat.mean == pytest.approx(statistics.fmean(values))
        assert cell.stat.std == pytest.approx(statistics.stdev(values))
    means = [t.rows[0][0].stat.mean, t.rows[0][2].stat.mean]  # type: ignore[union-attr]
    best = 0 if means[0] > means[1] else 2
    assert t.rows[0][best].mark == "best"
    assert t.rows[0][2 - best].mark == "second"


def test_table10_ablation_rows_and_paper_values(grid_dir: Path) -> None:
    runs, _ = find_runs(grid_dir)
    t = table10(runs, paper=True)
    variants = [labels[2] for labels in t.labels if labels[0]]
    assert variants == ["1", "5", "10", "20"]
    assert not [labels for labels in t.labels if labels[-1] == "paper"]  # the paper's sweeps are CIFAR10-MNIST-B's
    assert sum(c.mark == "best" for cells in t.rows for c in cells) >= 2
    # The same runs labelled as CIFAR10-MNIST-B get the paper's values beside them.
    relabelled = [dataclasses.replace(r, summary={**r.summary, "setting": "cifar10-mnist-b"}) for r in runs]
    t = table10(relabelled, paper=True)
    paper_rows = [cells for labels, cells in zip(t.labels, t.rows) if labels[-1] == "paper"]
    assert paper_rows[0][0].stat is not None and paper_rows[0][0].stat.mean == 61.98  # K = 1, paper Table 10


def test_renderers_and_cli_tables(grid_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, _ = find_runs(grid_dir)
    tables = build_tables(runs, paper=True)
    assert [t.key for t in tables] == ["1", "8", "9", "11", "7", "10", "13"]
    md, tex, csv_text = to_markdown(tables[0]), to_latex(tables[0]), to_csv(tables[0])
    assert "| MultiMNIST |" in md and "**" in md and "| paper |" in md and "Δ (ours − paper)" in md
    assert "\\textbf{" in tex and "$\\pm$" in tex and "\\underline{" in tex
    assert csv_text.splitlines()[0].startswith("table,Setting,column,mean,std,n")
    assert main(["table", str(grid_dir), "--table", "1,11", "--paper"]) == 0
    out = capsys.readouterr().out
    assert "Table 1" in out and "Table 11" in out and "90.72 ± 0.65" in out
    assert main(["table", str(grid_dir), "--table", "12"]) == 2


def test_tables_and_plots_never_import_torch(grid_dir: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from fedhv.cli import main\n"
        f"assert main(['table', {str(grid_dir)!r}, '--format', 'latex']) == 0\n"
        f"assert main(['plot', {str(grid_dir)!r}, '--out', {str(tmp_path / 'fig')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(p.name for p in (tmp_path / "fig").glob("*.png"))
    assert pngs == ["ablation-multimnist-local_steps.png", "curves-multimnist.png", "tasks-multimnist.png",
                    "wallclock-multimnist.png", "weights-multimnist.png"]
    for name in pngs:
        data = (tmp_path / "fig" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert len(list((tmp_path / "fig").glob("*.pdf"))) == 5


def test_grid_rejects_bad_input_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g"
    assert main(["grid", "multimnist", "--methods", "fedhv,fedavg", "--out", str(out), "--quiet"]) == 2
    assert "method = 'fedavg' is not supported" in capsys.readouterr().err
    assert main(["grid", "multimnist", "--ablation", "depth", "--out", str(out), "--quiet"]) == 2
    assert "--ablation 'depth'" in capsys.readouterr().err
    assert main(["grid", "multimnist", "--seeds", "0,x", "--out", str(out), "--quiet"]) == 2
    assert not out.exists()


def test_calibration_is_shared_exactly_where_the_paper_shares_it(tmp_path: Path) -> None:
    from fedhv.experiment.grid import plan_grid

    _, cals = plan_grid(["cifar10-mnist-a", "cifar10-mnist-b", "celeba5-a", "celeba5-b", "multimnist"],
                        ["uniform", "fedhv"], [0, 42, 2026], tmp_path)
    names = sorted(Path(c.path).name.split("-")[0] for c in cals)
    assert names == ["celeba5", "cifar10", "multimnist"]  # one per family (paper B.8)
    _, cals = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path, ["calibration.margin=0.3"])
    _, cals_default = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path)
    assert cals[0].path != cals_default[0].path  # a different calibration is not reused
