"""``fedhv table --table ranks``: every method of a setting ranked on MeanAcc and WorstAcc, on hand-made run
directories whose ranks are worked out by hand; a method's own label comes from its ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path

from fedhv.results.collect import find_runs, method_label
from fedhv.results.tables import build_tables
from fedhv.results.tables_field import ranks

#: method -> [(seed, MeanAcc, WorstAcc)]
RESULTS = {"fedhv": [(0, 91.0, 89.0), (1, 91.2, 89.4)], "uniform": [(0, 90.8, 89.2), (1, 91.0, 89.2)],
           "dwa": [(0, 90.0, 87.0), (1, 90.4, 87.4)], "fsmgda-upgrad": [(0, 91.4, 88.0), (1, 91.6, 88.2)]}


def _runs(root: Path) -> None:
    for method, rows in RESULTS.items():
        for seed, mean, worst in rows:
            folder = root / method / f"s{seed}"
            folder.mkdir(parents=True)
            lr = "[train]\nlr_global = 2.0\nlr_local = 0.15\n" if method.startswith("fsmgda") else \
                "[train]\nlr_global = 1.2\nlr_local = 0.3\n"
            (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "{method}"\nseed = {seed}\n{lr}')
            summary = {"setting": "multimnist", "method": method, "seed": seed, "tasks": ["L", "R"],
                       "mean_acc": mean, "worst_acc": worst, "hv": mean / 10}
            labels = {"fsmgda-upgrad": "UPGrad (FSMGDA)", "dwa": "DWA"}
            if method in labels:
                summary["label"] = labels[method]
            (folder / "summary.json").write_text(json.dumps(summary))


def test_ranks_share_the_average_place_on_ties() -> None:
    assert ranks({"a": 3.0, "b": 1.0, "c": 2.0}, True) == {"a": 1, "c": 2, "b": 3}
    assert ranks({"a": 3.0, "b": 3.0, "c": 2.0, "d": 1.0}, True) == {"a": 1.5, "b": 1.5, "c": 3, "d": 4}
    assert ranks({"a": 0.1, "b": 0.3}, False) == {"a": 1, "b": 2}


def test_the_ranking_table_orders_methods_by_mean_rank(tmp_path: Path) -> None:
    _runs(tmp_path)
    runs, _ = find_runs(tmp_path)
    (table,) = build_tables(runs, ["ranks"])
    # MeanAcc means: upgrad 91.5 (1), fedhv 91.1 (2), uniform 90.9 (3), dwa 90.2 (4)
    # WorstAcc means: uniform 89.2 (1), fedhv 89.2 (tie: 1.5 each), upgrad 88.1 (3), dwa 87.2 (4)
    got = {labels[0]: [c.plain(with_std=False) for c in row] for labels, row in zip(table.labels, table.rows)}
    assert list(got) == ["FedHV", "UPGrad (FSMGDA)", "Uniform", "DWA"]
    assert got["FedHV"][3:7] == ["2", "1.5", "1.75", "2"]
    assert got["UPGrad (FSMGDA)"][3:8] == ["1", "3", "2", "2", "2 / 0.15"]
    assert got["Uniform"][3:6] == ["3", "1.5", "2.25"]
    assert got["DWA"][3:6] == ["4", "4", "4"]
    assert got["FedHV"][0] == "91.10" and got["Uniform"][1] == "89.20"
    marks = {labels[0]: row[0].mark for labels, row in zip(table.labels, table.rows)}
    assert marks["UPGrad (FSMGDA)"] == "best" and marks["FedHV"] == "second"


#: method -> {factor: (MeanAcc, WorstAcc)} of the seed-0 sweep runs (x1 is the grid's own seed-0 run)
SWEEP = {"fedhv": {0.5: (90.0, 88.0), 2.0: (91.5, 89.9)}, "uniform": {0.5: (90.5, 88.5), 2.0: (89.0, 86.0)},
         "dwa": {0.5: (89.0, 87.5), 2.0: (91.0, 89.0)}, "fsmgda-upgrad": {0.5: (91.0, 88.4), 2.0: (92.0, 90.0)}}


def test_the_server_lr_sweep_table_ranks_each_factor(tmp_path: Path) -> None:
    _runs(tmp_path)
    for method, values in SWEEP.items():
        for factor, (mean, worst) in values.items():
            folder = tmp_path / f"lr_global_factor={factor}" / method / "s0"
            folder.mkdir(parents=True)
            own = 2.0 if method.startswith("fsmgda") else 1.2
            (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "{method}"\nseed = 0\n[train]\n'
                                                f"lr_global = {own * factor}\nlr_local = 0.3\n")
            (folder / "summary.json").write_text(json.dumps({"setting": "multimnist", "method": method, "seed": 0,
                                                             "tasks": ["L", "R"], "mean_acc": mean,
                                                             "worst_acc": worst, "hv": 7.0}))
            (folder / "grid-job.json").write_text(json.dumps({"ablation": "server-lr",
                                                              "variant": ["lr_global_factor", factor]}))
    runs, _ = find_runs(tmp_path)
    main, sweep = build_tables(runs, ["ranks"])
    assert [labels[0] for labels in main.labels] == ["FedHV", "UPGrad (FSMGDA)", "Uniform", "DWA"]  # unchanged
    assert sweep.header == [f"{w} ×{f}" for w in ("MeanAcc", "WorstAcc", "mean rank") for f in ("0.5", "1", "2")]
    got = {labels[0]: [c.plain(with_std=False) for c in row] for labels, row in zip(sweep.labels, sweep.rows)}
    # x1 = the seed-0 runs: fedhv 91.0/89.0, uniform 90.8/89.2, dwa 90.0/87.0, upgrad 91.4/88.0
    assert got["FedHV"][:6] == ["90.00", "91.00", "91.50", "88.00", "89.00", "89.90"]
    # x0.5 MeanAcc ranks: upgrad 1, uniform 2, fedhv 3, dwa 4; WorstAcc: uniform 1, upgrad 2, fedhv 3, dwa 4
    # x1: MeanAcc upgrad 1, fedhv 2, uniform 3, dwa 4; WorstAcc uniform 1, fedhv 2, upgrad 3, dwa 4
    # x2: MeanAcc upgrad 1, fedhv 2, dwa 3, uniform 4; WorstAcc upgrad 1, fedhv 2, dwa 3, uniform 4
    assert got["FedHV"][6:] == ["3", "2", "2"]
    assert got["UPGrad (FSMGDA)"][6:] == ["1.5", "2", "1"]
    assert got["Uniform"][6:] == ["1.5", "2", "4"]
    assert got["DWA"][6:] == ["4", "4", "3"]


def test_table_1_of_many_methods_has_a_row_per_method(tmp_path: Path) -> None:
    """Above six methods Tables 1 and 8 turn: a row per method, a column per setting and metric (same cells)."""
    methods = ["uniform", "fedhv", "dwa", "rlw", "famo", "stch", "inverse-loss", "fsmgda-upgrad"]
    for setting, shift in (("multimnist", 0.0), ("mnist-fmnist", -4.0)):
        for k, method in enumerate(methods):
            for seed in (0, 1):
                folder = tmp_path / setting / method / f"s{seed}"
                folder.mkdir(parents=True)
                (folder / "config.toml").write_text(f'setting = "{setting}"\nmethod = "{method}"\nseed = {seed}\n')
                mean, worst = 90.0 + shift + k / 10 + seed / 100, 88.0 + shift - k / 10
                (folder / "summary.json").write_text(json.dumps(
                    {"setting": setting, "method": method, "seed": seed, "tasks": ["L", "R"], "mean_acc": mean,
                     "worst_acc": worst, "mean_loss": 0.3, "hv": 7.0}))
    runs, _ = find_runs(tmp_path)
    table, table8 = build_tables(runs, ["1", "8"])
    assert table.label_header == ["Method"] and table8.label_header == ["Method"]
    assert table.header == ["MultiMNIST MeanAcc ↑", "MultiMNIST WorstAcc ↑", "MNIST–FMNIST MeanAcc ↑",
                            "MNIST–FMNIST WorstAcc ↑"]
    rows = {labels[0]: row for labels, row in zip(table.labels, table.rows)}
    assert sorted(rows) == sorted(method_label(m) for m in methods)
    k = methods.index("stch")
    stch = [c.stat.mean for c in rows[method_label("stch")]]  # type: ignore[union-attr]
    assert stch == [90.0 + k / 10 + 0.005, 88.0 - k / 10, 86.0 + k / 10 + 0.005, 84.0 - k / 10]
    assert rows[method_label("fsmgda-upgrad")][0].mark == "best" and rows["Uniform"][1].mark == "best"  # per column
    assert {(r.setting, r.method, r.metric) for r in table.records} == {
        (s, m, x) for s in ("multimnist", "mnist-fmnist") for m in methods for x in ("mean_acc", "worst_acc")}
    (paper,) = build_tables(runs, ["1"], paper=True)  # the paper's rows need the paper's shape
    assert paper.label_header == ["Setting"]
