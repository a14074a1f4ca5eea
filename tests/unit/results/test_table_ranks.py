"""``fedhv table --table ranks``: every method of a setting ranked on MeanAcc and WorstAcc, on hand-made run
directories whose ranks are worked out by hand; a method's own label comes from its ``summary.json``."""

from __future__ import annotations

import json
from pathlib import Path

from fedhv.results.collect import find_runs
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
