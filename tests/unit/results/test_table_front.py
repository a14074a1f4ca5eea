"""``fedhv table --table front,margin`` on hand-made front runs: the indicators against their numpy
definitions (2-D hypervolume by sweeping the sorted points, IGD+ and ε+ as written in Ishibuchi et al.
and Zitzler et al.), "beyond Linear" and the margin table worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhv.results.collect import find_runs
from fedhv.results.tables import build_tables

U = [(0.25, 0.75), (0.5, 0.5), (0.75, 0.25)]
#: family folder -> seed -> the final test-loss vector per direction of U
LOSSES = {
    "margin=0.15/fedhv": {0: [(0.9, 0.2), (0.5, 0.5), (0.2, 1.0)], 1: [(1.0, 0.25), (0.55, 0.5), (0.3, 0.9)]},
    "margin=1/fedhv": {0: [(0.7, 0.4), (0.5, 0.45), (0.45, 0.6)], 1: [(0.8, 0.35), (0.6, 0.5), (0.5, 0.6)]},
    "linear": {0: [(0.6, 0.3), (0.5, 0.55), (0.35, 0.8)], 1: [(0.7, 0.3), (0.6, 0.6), (0.4, 0.8)]},
}
ACC = {0.15: [(91.0, 89.0), (90.8, 89.4)], 1.0: [(90.0, 88.0), (90.2, 88.6)]}


def _write(root: Path) -> None:
    for fam, seeds in LOSSES.items():
        method = fam.split("/")[-1]
        delta = float(fam.split("/")[0].split("=")[1]) if "/" in fam else None
        for seed, points in seeds.items():
            for u, loss in zip(U, points):
                folder = root / "multimnist" / "front" / f"u={u[0]:g},{u[1]:g}" / fam / f"s{seed}"
                folder.mkdir(parents=True)
                (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "{method}"\nseed = {seed}\n')
                acc = ACC[delta][seed] if delta is not None and u == (0.5, 0.5) else (90.0, 88.0)
                summary = {"setting": "multimnist", "method": method, "seed": seed, "tasks": ["L", "R"],
                           "task_loss": list(loss), "task_acc": list(acc), "hv_reference": [3.0, 3.0],
                           "mean_acc": sum(acc) / 2,
                           "worst_acc": min(acc), "hv": (3 - loss[0]) * (3 - loss[1])}
                if method == "linear":
                    summary["label"] = "Linear"
                (folder / "summary.json").write_text(json.dumps(summary))
                (folder / "grid-job.json").write_text(json.dumps(
                    {"setting": "multimnist", "method": method, "seed": seed, "ablation": "front",
                     "variant": ["front", [list(u), delta]]}))


def _nondominated(p: np.ndarray) -> np.ndarray:
    keep = [i for i in range(len(p)) if not any((p[j] <= p[i]).all() and (p[j] < p[i]).any() for j in range(len(p)))]
    return p[keep]


def _hv2(p: np.ndarray, r: float = 3.0) -> float:
    """2-D hypervolume: sweep the non-dominated points by their first loss."""
    front = _nondominated(p)
    front = front[np.argsort(front[:, 0])]
    area, top = 0.0, r
    for x, y in front:
        area += (r - x) * (top - y)
        top = y
    return area


def _igd_plus(p: np.ndarray, z: np.ndarray) -> float:
    return float(np.mean([min(np.linalg.norm(np.maximum(a - b, 0)) for a in p) for b in z]))


def _eps(p: np.ndarray, z: np.ndarray) -> float:
    return float(max(min(np.max(a - b) for a in p) for b in z))


def test_front_indicators_equal_their_definitions(tmp_path: Path) -> None:
    _write(tmp_path)
    runs, _ = find_runs(tmp_path)
    tables = build_tables(runs, ["front"])
    assert [t.slug for t in tables] == ["multimnist-front"]
    (table,) = tables
    records = {(r.method, r.metric): r.ours for r in table.records}
    z = _nondominated(np.array([p for seeds in LOSSES.values() for pts in seeds.values() for p in pts]))
    for fam, seeds in LOSSES.items():
        key = fam.split("/")[-1] if "/" not in fam else f"fedhv@margin={fam.split('/')[0].split('=')[1]}"
        for metric, oracle in (("hv", _hv2), ("igd_plus", lambda p: _igd_plus(_nondominated(p), z)),
                               ("eps_add", lambda p: _eps(_nondominated(p), z))):
            per_seed = [oracle(np.array(pts)) for _, pts in sorted(seeds.items())]
            stat = records[(key, f"front_{metric}")]
            assert stat is not None and stat.n == 2
            np.testing.assert_allclose(stat.values, per_seed, rtol=1e-12, atol=1e-15)
    rows = {labels[0]: [c.plain(with_std=False) for c in row] for labels, row in zip(table.labels, table.rows)}
    assert list(rows) == ["FedHV δ=0.15", "FedHV δ=1", "Linear"]
    # seed 0: all three FedHV δ=0.15 points are non-dominated and none is weakly dominated by Linear's
    # (0.6,0.3) (0.5,0.55) (0.35,0.8); seed 1: (1.0,0.25), (0.55,0.5), (0.3,0.9) likewise -> 3 and 3.
    # FedHV δ=1 seed 0: (0.7,0.4) is dominated by Linear's (0.6,0.3); (0.5,0.45) and (0.45,0.6) are not -> 2;
    # seed 1: (0.8,0.35), (0.6,0.5), (0.5,0.6): (0.8,0.35) by (0.7,0.3); the others not -> 2.
    assert rows["FedHV δ=0.15"][-1] == "3.0" and rows["FedHV δ=1"][-1] == "2.0" and rows["Linear"][-1] == "–"
    assert rows["FedHV δ=0.15"][0] == "3" and rows["Linear"][1] == "3.0"
    # lowest loss per task, mean over seeds: FedHV δ=0.15 (0.2 + 0.3) / 2, (0.2 + 0.25) / 2
    assert rows["FedHV δ=0.15"][5] == "0.2500 / 0.2250"


def test_the_margin_table_takes_fedhvs_uniform_direction_runs(tmp_path: Path) -> None:
    _write(tmp_path)
    runs, _ = find_runs(tmp_path)
    (table,) = build_tables(runs, ["margin"])
    rows = {labels[0]: [c.plain(with_std=False) for c in row] for labels, row in zip(table.labels, table.rows)}
    assert list(rows) == ["0.15", "1"]
    # MeanAcc (91 + 89) / 2 and (90.8 + 89.4) / 2 -> 90.05; WorstAcc (89.0 + 89.4) / 2
    assert rows["0.15"][:2] == ["90.05", "89.20"] and rows["1"][:2] == ["89.20", "88.30"]
    # HV of the uniform-direction points: (3-0.5)(3-0.5) and (3-0.55)(3-0.5), mean
    assert rows["0.15"][2] == f"{((2.5 * 2.5) + (2.45 * 2.5)) / 2:.3f}" and rows["0.15"][3] == "2"


def test_front_runs_stay_out_of_the_other_tables(tmp_path: Path) -> None:
    _write(tmp_path)
    runs, _ = find_runs(tmp_path)
    assert build_tables(runs, ["1", "10", "ranks"]) == []


def test_the_front_figure_draws_the_median_attainment_surface(tmp_path: Path) -> None:
    from fedhv.results.plots import build_figures

    _write(tmp_path)
    runs, _ = find_runs(tmp_path)
    figures = dict(build_figures(runs))
    assert sorted(figures) == ["front-multimnist-accuracy", "front-multimnist-loss"]
    ax = figures["front-multimnist-loss"].axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "FedHV δ=0.15"]
    # attained by at least one of the two seeds: the non-dominated union (0.2, 1), (0.3, 0.9), (0.5, 0.5), (0.9, 0.2)
    # ((0.55, 0.5) and (1.0, 0.25) are dominated), drawn as the staircase bounding what they dominate
    assert list(line.get_xdata()) == [0.2, 0.3, 0.3, 0.5, 0.5, 0.9, 0.9]
    assert list(line.get_ydata()) == [1.0, 1.0, 0.9, 0.9, 0.5, 0.5, 0.2]
    # losses from 0.2 to 1.0 (5x > LOG_SPAN): log axes, labelled plainly; accuracy stays linear
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert figures["front-multimnist-accuracy"].axes[0].get_xscale() == "linear"
    assert ax.get_legend_handles_labels()[1] == ["FedHV δ=0.15", "FedHV δ=1", "Linear"]  # by method, then margin
    import matplotlib.pyplot as plt

    for fig in figures.values():
        plt.close(fig)


def test_three_tasks_get_pairwise_projections_and_the_table(tmp_path: Path) -> None:
    from fedhv.results.plots import build_figures

    rng = np.random.default_rng(3)
    for k, u in enumerate([(0.5, 0.25, 0.25), (0.25, 0.5, 0.25), (0.25, 0.25, 0.5)]):
        for method, delta in (("fedhv", 0.15), ("fedhv", 1.0), ("linear", None)):
            folder = tmp_path / "three" / "front" / f"u{k}" / (f"margin={delta:g}/" if delta else "") / method / "s0"
            folder.mkdir(parents=True)
            loss = (0.5 + rng.random(3)).tolist()
            (folder / "config.toml").write_text(f'setting = "three"\nmethod = "{method}"\nseed = 0\n')
            (folder / "summary.json").write_text(json.dumps({
                "setting": "three", "method": method, "seed": 0, "tasks": ["a", "b", "c"], "task_loss": loss,
                "task_acc": [90.0, 80.0, 70.0], "hv_reference": [3.0, 3.0, 3.0], "mean_acc": 80.0, "worst_acc": 70.0}))
            (folder / "grid-job.json").write_text(json.dumps({"setting": "three", "method": method, "seed": 0,
                                                              "ablation": "front", "variant": ["front", [list(u), delta]]}))
    runs, _ = find_runs(tmp_path)
    figures = dict(build_figures(runs))
    fig = figures["front-three-loss"]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in visible] == [
        ("a test loss", "b test loss"), ("a test loss", "c test loss"), ("b test loss", "c test loss")]
    assert all(not ax.get_lines() for ax in visible)  # no attainment surfaces above two tasks
    # two margins of one method share its colour: their markers tell them apart (no lines above two tasks)
    handles = dict(zip(*reversed(visible[0].get_legend_handles_labels())))
    shapes = {label: handles[label].get_paths()[0].vertices.round(6).tobytes() for label in ("FedHV δ=0.15", "FedHV δ=1")}
    assert shapes["FedHV δ=0.15"] != shapes["FedHV δ=1"]
    (table,) = build_tables(runs, ["front"])
    hv = {r.method: r.ours for r in table.records if r.metric == "front_hv"}
    assert set(hv) == {"fedhv@margin=0.15", "fedhv@margin=1", "linear"} and all(s is not None and s.mean > 0 for s in hv.values())
    import matplotlib.pyplot as plt

    for f in figures.values():
        plt.close(f)


def test_a_seed_covering_fewer_directions_is_left_out_of_its_familys_row(tmp_path: Path) -> None:
    _write(tmp_path)
    # a margin-sweep run at the uniform direction only, beside a full front on seed 0
    for seed, directions in ((0, U), (1, [(0.5, 0.5)])):
        for u in directions:
            folder = tmp_path / "multimnist" / "front" / f"u={u[0]:g},{u[1]:g}" / "margin=3/fedhv" / f"s{seed}"
            folder.mkdir(parents=True)
            (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "fedhv"\nseed = {seed}\n')
            (folder / "summary.json").write_text(json.dumps(
                {"setting": "multimnist", "method": "fedhv", "seed": seed, "tasks": ["L", "R"],
                 "task_loss": [0.3 + u[0], 0.3 + u[1]], "task_acc": [90.0, 88.0], "hv_reference": [3.0, 3.0],
                 "mean_acc": 89.0, "worst_acc": 88.0}))
            (folder / "grid-job.json").write_text(json.dumps(
                {"setting": "multimnist", "method": "fedhv", "seed": seed, "ablation": "front",
                 "variant": ["front", [list(u), 3.0]]}))
    runs, _ = find_runs(tmp_path)
    (table,) = build_tables(runs, ["front"])
    hv = {r.method: r.ours for r in table.records if r.metric == "front_hv"}
    seed0 = np.array([[0.3 + u[0], 0.3 + u[1]] for u in U])
    assert hv["fedhv@margin=3"].n == 1 and hv["fedhv@margin=3"].mean == pytest.approx(_hv2(seed0))  # type: ignore[union-attr]
    assert any("FedHV δ=3: seed(s) 1 left out" in n for n in table.notes)
    assert hv["fedhv@margin=0.15"].n == 2  # type: ignore[union-attr]  # complete on both seeds: kept


FRONT_DAMAGES = {
    # the last task_loss one value longer than its siblings' (a received run edited or from another setting)
    "loss-length": ("summary.json", lambda s: {**s, "task_loss": [*s["task_loss"], 0.4],
                                               "task_acc": [*s["task_acc"], 80.0]}),
    # a front run's variant that is no [u, delta]
    "variant-number": ("grid-job.json", lambda j: {**j, "variant": ["front", 5]}),
}


@pytest.mark.parametrize("damage", list(FRONT_DAMAGES))
def test_a_damaged_front_run_is_skipped_with_a_warning_naming_it(tmp_path: Path, damage: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``fedhv table --table front`` and ``fedhv plot`` leave the damaged run out with one warning naming it and
    tabulate / draw the rest, as the paper tables do (issue 52: both ended with a traceback)."""
    from fedhv.cli import main

    _write(tmp_path)
    run = tmp_path / "multimnist" / "front" / "u=0.5,0.5" / "linear" / "s1"
    name, edit = FRONT_DAMAGES[damage]
    (run / name).write_text(json.dumps(edit(json.loads((run / name).read_text()))))
    capsys.readouterr()
    assert main(["table", str(tmp_path), "--table", "front"]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and str(run) in warnings[0] and "left out" in warnings[0], err
    assert "Linear" in out and "FedHV δ=0.15" in out
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "figures"), "--formats", "png"]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and str(run) in warnings[0], err
    assert (tmp_path / "figures" / "front-multimnist-loss.png").is_file()
    import matplotlib.pyplot as plt

    plt.close("all")
