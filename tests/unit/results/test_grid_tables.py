"""``fedhv grid`` (shared calibration, resume, ablations) and the torch-free tables and figures."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedhv.cli import main
from fedhv.results.collect import find_runs
from fedhv.results.plots import build_figures
from fedhv.results.table_model import to_csv, to_latex, to_markdown
from fedhv.results.tables import build_tables, table1, table10

from conftest import REPO, SMALL

pytestmark = pytest.mark.needs_data  # every test here reads the real data

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
    # the standard FedHV runs (local_steps = 3, two seeds) are the sweep's baseline row
    assert variants == ["1", "3 (baseline)", "5", "10", "20"]
    assert not [labels for labels in t.labels if labels[-1] == "paper"]  # the paper's sweeps are CIFAR10-MNIST-B's
    assert not [n for n in t.notes if "No baseline" in n]
    # Within the sweep: bold the variant with the highest MeanAcc / lowest MeanLoss, underline the next.
    finals = {r.config_value("train.local_steps"): r.summary for r in runs if r.variant}
    base = [r.summary for r in runs if r.variant is None and r.method == "fedhv"]
    finals[3] = {k: statistics.fmean(s[k] for s in base) for k in ("mean_acc", "mean_loss")}
    sweep = [(labels, cells) for labels, cells in zip(t.labels, t.rows) if labels[0]]
    for col, key, sign in ((0, "mean_acc", -1), (1, "mean_loss", 1)):
        ranked = sorted(finals, key=lambda k: sign * finals[k][key])
        marks = {int(labels[2].split()[0]): cells[col].mark for labels, cells in sweep}
        assert marks == {k: {0: "best", 1: "second"}.get(ranked.index(k), "") for k in finals}, key
        assert {int(labels[2].split()[0]): cells[col].stat.mean for labels, cells in sweep} == pytest.approx({
            k: finals[k][key] for k in finals}, abs=1e-9)
    # Without the standard runs the sweep stands alone, and the table says so.
    alone = table10([r for r in runs if r.variant], paper=True)
    assert [labels[2] for labels in alone.labels if labels[0]] == ["1", "5", "10", "20"]
    assert any("No baseline" in n and "MultiMNIST (local_steps)" in n for n in alone.notes), alone.notes
    # The same runs labelled as CIFAR10-MNIST-B get the paper's values beside them.
    relabelled = [dataclasses.replace(r, summary={**r.summary, "setting": "cifar10-mnist-b"}) for r in runs]
    t = table10(relabelled, paper=True)
    paper_rows = [cells for labels, cells in zip(t.labels, t.rows) if labels[-1] == "paper"]
    assert paper_rows[0][0].stat is not None and paper_rows[0][0].stat.mean == 61.98  # K = 1, paper Table 10


def test_renderers_and_cli_tables(grid_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs, _ = find_runs(grid_dir)
    tables = build_tables(runs, paper=True)
    assert [t.key for t in tables] == ["1", "8", "9", "11", "7", "10", "12", "13"]
    md, tex, csv_text = to_markdown(tables[0]), to_latex(tables[0]), to_csv(tables[0])
    # The expected Table 1 rows, computed from the runs' summaries: mean ± sample std over the
    # seeds, per metric the higher mean bold and the other underlined; the paper's row and
    # our difference from it (paper Table 1, MultiMNIST: Uniform 90.17 ± 0.18 / 88.14 ± 0.34,
    # FedHV 90.72 ± 0.65 / 88.94 ± 0.61).
    columns = [("uniform", "mean_acc"), ("uniform", "worst_acc"), ("fedhv", "mean_acc"), ("fedhv", "worst_acc")]
    values = {c: [r.summary[c[1]] for r in runs if (r.method, r.variant) == (c[0], None)] for c in columns}
    means = {c: statistics.fmean(v) for c, v in values.items()}
    text = {c: f"{means[c]:.2f} ± {statistics.stdev(v):.2f}" for c, v in values.items()}
    best = {key: max(("uniform", "fedhv"), key=lambda m: means[(m, key)]) for key in ("mean_acc", "worst_acc")}
    md_cells = [f"**{text[c]}**" if best[c[1]] == c[0] else f"<u>{text[c]}</u>" for c in columns]
    paper = {("uniform", "mean_acc"): 90.17, ("uniform", "worst_acc"): 88.14, ("fedhv", "mean_acc"): 90.72,
             ("fedhv", "worst_acc"): 88.94}
    lines = md.splitlines()
    assert "| MultiMNIST | " + " | ".join(md_cells) + " |" in lines
    assert "| paper | 90.17 ± 0.18 | 88.14 ± 0.34 | 90.72 ± 0.65 | 88.94 ± 0.61 |" in lines
    # these runs are not the paper's setting (3 rounds, 6 clients, ...): no Δ numbers (test_outputs_format.py)
    assert "| Δ n/a: setting differs | n/a | n/a | n/a | n/a |" in lines
    tex_cells = [("\\textbf{" if best[c[1]] == c[0] else "\\underline{") + text[c].replace("±", "$\\pm$") + "}"
                 for c in columns]
    assert "MultiMNIST & " + " & ".join(tex_cells) + " \\\\" in tex.splitlines()
    csv_lines = csv_text.splitlines()
    assert csv_lines[0] == "table,setting,method,metric,mean,std,n_seeds,paper_mean,paper_std"
    for c, line in zip(columns, csv_lines[1:5]):
        cells = line.split(",")
        assert cells[:4] == ["1", "multimnist", *c] and float(cells[4]) == pytest.approx(means[c])
        assert cells[6] == str(len(values[c])) and float(cells[7]) == paper[c]
    assert main(["table", str(grid_dir), "--table", "1,11", "--paper"]) == 0
    out = capsys.readouterr().out
    assert "Table 1" in out and "Table 11" in out and "90.72 ± 0.65" in out
    assert main(["table", str(grid_dir), "--table", "14"]) == 2


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
    assert pngs == ["ablation-multimnist-local_steps.png", "bars-multimnist.png", "curves-multimnist.png", "tasks-multimnist.png",
                    "wallclock-multimnist.png", "weights-multimnist.png"]
    for name in pngs:
        data = (tmp_path / "fig" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert len(list((tmp_path / "fig").glob("*.pdf"))) == 6


def _band_half_widths(band: Any, x: np.ndarray) -> np.ndarray:
    """Half the vertical extent, at each of ``x``, of a ``fill_between`` band."""
    vertices = np.concatenate([path.vertices for path in band.get_paths()])
    return np.array([np.ptp(vertices[vertices[:, 0] == xi, 1]) / 2 for xi in x])


def _expected(runs: list, entries: str, value: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Rounds, mean and sample std (None for one run) over ``runs`` of ``value(entry)``."""
    per_run = [{e["round"]: value(e) for e in getattr(r, entries)} for r in runs]
    rounds = sorted(set.intersection(*(set(d) for d in per_run)))
    ys = np.array([[d[t] for t in rounds] for d in per_run], dtype=float)
    return np.array(rounds, dtype=float), ys.mean(0), ys.std(0, ddof=1) if len(runs) > 1 else None


def _check_line(line: Any, band: Any, expected: tuple[np.ndarray, np.ndarray, np.ndarray | None]) -> None:
    """``line`` plots the expected mean against the rounds; ``band`` is ±1 std around it."""
    x, mean, std = expected
    np.testing.assert_allclose(line.get_xdata(), x)
    np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-12)
    assert std is not None
    np.testing.assert_allclose(_band_half_widths(band, x), std, rtol=1e-9, atol=1e-12)


def test_figures_plot_the_runs_data(grid_dir: Path) -> None:
    """Every figure's lines are the mean over seeds of the runs' records, bands ±1 sample std."""
    plt = pytest.importorskip("matplotlib.pyplot")
    runs, _ = find_runs(grid_dir)
    by_method = {m: [r for r in runs if r.method == m and r.variant is None] for m in ("uniform", "fedhv")}
    figures = dict(build_figures(runs))
    try:
        assert list(figures) == ["curves-multimnist", "tasks-multimnist", "weights-multimnist",
                                 "wallclock-multimnist", "bars-multimnist", "ablation-multimnist-local_steps"]
        axes = figures["curves-multimnist"].axes
        for ax, key in zip(axes, ("mean_acc", "worst_acc", "mean_loss", "hv")):
            lines = ax.get_lines()
            assert [ln.get_label() for ln in lines] == ["Uniform", "FedHV"], key
            assert len(ax.collections) == 2  # one band per method (two seeds each)
            for line, band, method in zip(lines, ax.collections, ("uniform", "fedhv")):
                _check_line(line, band, _expected(by_method[method], "metrics", lambda e, k=key: e[k]))
        tasks = figures["tasks-multimnist"].axes  # row 0: accuracy of task 0, 1; row 1: loss
        for ax, (key, i) in zip(tasks, [("task_acc", 0), ("task_acc", 1), ("task_loss", 0), ("task_loss", 1)]):
            for line, method in zip(ax.get_lines(), ("uniform", "fedhv"), strict=True):
                np.testing.assert_allclose(
                    line.get_ydata(), _expected(by_method[method], "metrics", lambda e, k=key, i=i: e[k][i])[1], rtol=1e-12)
        (ax,) = figures["weights-multimnist"].axes
        w0, w1, uniform = ax.get_lines()
        assert (w0.get_label(), w1.get_label()) == ("w[left]", "w[right]")
        assert list(uniform.get_ydata()) == [0.5, 0.5]  # the 1/m guide
        for i, (line, band) in enumerate(zip((w0, w1), ax.collections, strict=True)):
            _check_line(line, band, _expected(by_method["fedhv"], "rounds", lambda e, i=i: e["weights"][i]))
        (ax,) = figures["wallclock-multimnist"].axes
        for line, method in zip(ax.get_lines(), ("uniform", "fedhv"), strict=True):
            offset = statistics.fmean((r.summary.get("calibration") or {}).get("seconds", 0.0)
                                      for r in by_method[method])
            assert (offset > 0) == (method == "fedhv")  # FedHV starts at its calibration's cost
            x, mean, _ = _expected(by_method[method], "rounds", lambda e: e["wall_clock_s"])
            np.testing.assert_allclose(line.get_xdata(), [0, *x])
            np.testing.assert_allclose(line.get_ydata(), [offset, *(mean + offset)], rtol=1e-12)
        (ax,) = figures["ablation-multimnist-local_steps"].axes
        lines = ax.get_lines()
        assert [ln.get_label() for ln in lines] == [f"local_steps = {k}" for k in (1, 5, 10, 20)]
        assert not ax.collections  # one seed per variant: no band
        for line, k in zip(lines, (1, 5, 10, 20)):
            variant = [r for r in runs if r.variant and r.config_value("train.local_steps") == k]
            np.testing.assert_allclose(line.get_ydata(), _expected(variant, "metrics", lambda e: e["mean_acc"])[1])
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_table_7_has_the_stabilised_slack_and_a_row_per_ablation_variant(grid_dir: Path) -> None:
    from fedhv.results.tables import table7

    runs, _ = find_runs(grid_dir)
    t = table7(runs)
    rows = {labels[0]: cells for labels, cells in zip(t.labels, t.rows)}
    variants = sorted(r.config_value("train.local_steps") for r in runs if r.variant)
    assert [k for k in rows if ", K = " in k] == [f"MultiMNIST, K = {k}" for k in variants]
    for k in variants:
        (run,) = [r for r in runs if r.variant and r.config_value("train.local_steps") == k]
        # an independent reading of the run's rounds: min over rounds of max(raw slack, rho_clip)
        raw = min(rec["min_slack"] for rec in run.rounds)
        floor = sum(rec["floor_activations"] for rec in run.rounds)
        cells = rows[f"MultiMNIST, K = {k}"]
        assert cells[1].text == f"{raw:.4f}" and cells[2].text == f"{max(raw, 1e-6):.4g}"
        assert cells[3].text.startswith(f"{floor}/{2 * len(run.rounds)}")
    std = rows["MultiMNIST"]
    fedhv = [r for r in runs if r.method == "fedhv" and r.variant is None]
    assert std[2].text == f"{max(min(rec['min_slack'] for r in fedhv for rec in r.rounds), 1e-6):.4g}"


def test_table_12_reports_the_measured_payload_stages_and_times(grid_dir: Path) -> None:
    from fedhv.results.tables_extra import table12

    runs, _ = find_runs(grid_dir)
    (t,) = table12(runs)
    rows = {labels[0]: cells for labels, cells in zip(t.labels, t.rows)}
    assert list(rows) == ["Uniform", "FedHV"]
    for method, label in (("uniform", "Uniform"), ("fedhv", "FedHV")):
        rs = [r for r in runs if r.method == method and r.variant is None]
        last = rs[0].rounds[-1]  # payload per client of one round, from rounds.jsonl
        down, up = last["bytes_down_per_client"] / 1e6, last["bytes_up_per_client"] / 1e6
        cells = rows[label]
        assert cells[2].text == f"{down:.3f} / {up:.3f}"
        assert cells[3].text == f"{(down + up) * 4:.1f}"  # M = 4 clients per round (SMALL)
        assert cells[4].text == "1"  # one synchronisation stage for both
        per_round = [sum(rec["time_server_s"] for rec in r.rounds) / len(r.rounds) for r in rs]
        assert cells[6].stat is not None and cells[6].stat.mean == pytest.approx(sum(per_round) / len(per_round))
    assert rows["FedHV"][1].text == "Θ(d + m)" and rows["Uniform"][1].text == "Θ(d)"


def test_figure_2_bars_are_the_reported_per_task_accuracies(grid_dir: Path) -> None:
    import matplotlib.pyplot as plt

    from fedhv.results.collect import group
    from fedhv.results.plots_diagnostics import final_task_bars

    runs, _ = find_runs(grid_dir)
    fig = final_task_bars(group(runs), "multimnist")
    (ax,) = fig.axes
    bars = sorted(ax.patches, key=lambda p: p.get_x())
    expected = []
    for task in range(2):
        for method in ("uniform", "fedhv"):
            accs = [r.reported["task_acc"][task] for r in runs if r.method == method and r.variant is None]
            expected.append(sum(accs) / len(accs))
    assert [b.get_height() for b in bars] == pytest.approx(expected)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["left", "right"]
    plt.close(fig)


def test_examples_figure_of_a_pair_benchmark_and_of_celeba(tmp_path: Path) -> None:
    from celeba_fixture import make_celeba

    assert main(["plot", "--examples", "mnist-fmnist", "--out", str(tmp_path), "--formats", "png"]) == 0
    png = tmp_path / "fig4-examples-mnist-fmnist.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    from fedhv.data.benchmarks import load_benchmark
    from fedhv.results.examples_fig import examples_figure

    bench = load_benchmark("mnist-fmnist")
    fig = examples_figure(bench, "mnist-fmnist")
    titles = [ax.get_title() for ax in fig.axes]
    first = bench.train_y[:, 0]
    names = ("T-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
    assert titles == [f"{c} / {names[int(bench.train_y[int(np.flatnonzero(first == c)[0]), 1])]}" for c in range(6)]
    make_celeba(tmp_path / "data" / "celeba", n=160)
    assert main(["plot", "--examples", "celeba5-b", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path),
                 "--formats", "png"]) == 0
    assert (tmp_path / "fig4-examples-celeba5-b.png").stat().st_size > 10_000
    assert main(["plot", "--out", str(tmp_path)]) == 2  # neither DIR nor --examples
