"""Issue 16, protocol: CelebA5-A's all-label strata, partition heterogeneity, and which
test evaluation the final-result tables report (paper Table 3 and B.5).

Oracles are independent of the code under test: stratum codes are written as bit strings,
total-variation distances are counted by hand, and the tables are read from hand-built run
directories whose ``metrics.jsonl`` holds known values at rounds 198 and 200.
"""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from celeba_fixture import make_celeba
from fedhv.config import load_config
from fedhv.data.benchmarks import load_benchmark
from fedhv.data.partition import dirichlet_partition
from fedhv.objectives import CLASSIFICATION, MultiLabel

from helpers import cli as fedhv  # fedhv.cli.main in this process


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("celeba-i16")
    make_celeba(root / "celeba", n=200)
    return root


def _bits(labels: np.ndarray, columns: list[int]) -> np.ndarray:
    """Stratum codes written out as bit strings (first column most significant)."""
    return np.array([int("".join(str(int(row[c])) for c in columns), 2) for row in labels], dtype=np.int64)


def _tv_by_hand(labels: np.ndarray, parts: np.ndarray, groups: list[list[int]]) -> float:
    """Mean over clients and tasks of the mean over a task's binary attributes of |p - q|."""
    total = 0.0
    for row in parts:
        for g in groups:
            total += sum(abs(labels[row, a].mean() - labels[:, a].mean()) for a in g) / len(g)
    return total / (len(parts) * len(groups))


# -- item 1: strata ---------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
def test_celeba5_a_strata_are_the_joint_code_of_all_40_attributes(celeba_root: Path) -> None:
    cfg = load_config("celeba5-a", ["train.clients_per_round=2", "partition.clients=4",
                                    "partition.samples_per_client=8", "train.batch_size=2"])
    assert cfg.partition.strata == "all-attributes"
    assert (cfg.calibration.partition_strata, cfg.calibration.partition_alpha) == ("first-label", 0.30)
    bench = load_benchmark("celeba5", root=str(celeba_root))
    y = bench.train_y
    assert y.shape[1] == 40
    np.testing.assert_array_equal(bench.strata("all-attributes"), _bits(y, list(range(40))))
    rates = y.mean(0)
    reps = [min(g, key=lambda a: (abs(rates[a] - 0.5), a)) for g in bench.objective.groups]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(bench.strata("task-representatives"), _bits(y, reps))
    with pytest.warns(UserWarning, match="'all-attributes'"):
        legacy = bench.strata("all-label")
    np.testing.assert_array_equal(legacy, _bits(y, reps))  # earlier runs keep their partition
    np.testing.assert_array_equal(bench.strata("first-label"), _bits(y, [2, 20, 21]))


def test_classification_strata_rules_all_give_the_joint_label(data_root: Path) -> None:
    bench = load_benchmark("multimnist", root=str(data_root))
    joint = 10 * bench.train_y[:, 0] + bench.train_y[:, 1]
    for rule in ("all-label", "all-attributes", "task-representatives"):
        np.testing.assert_array_equal(bench.strata(rule), joint)
    cfg = load_config("multimnist", ["partition.strata='all-attributes'"])
    assert cfg.partition.strata == "all-attributes"


def test_heterogeneity_is_the_mean_total_variation_distance() -> None:
    from fedhv.data.heterogeneity import Heterogeneity, client_task_tv

    # Two 2-class tasks; pool marginals (1/2, 1/2) each.
    labels = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    parts = np.array([[0, 1], [0, 2]])  # client 0: task 0 all class 0 (TV 1/2), task 1 balanced (TV 0)
    tv = client_task_tv(labels, parts, CLASSIFICATION, (2, 2))
    np.testing.assert_allclose(tv, [[0.5, 0.0], [0.0, 0.5]])
    h = Heterogeneity.of(tv)
    assert (h.mean_tv, h.max_client_tv, h.task_mean_tv) == (0.25, 0.25, (0.25, 0.25))
    # Three classes: pool (1/2, 1/4, 1/4); a client with (0, 1/2, 1/2) has TV = 1/2 (|-1/2| + 1/4 + 1/4) = 1/2.
    three = np.array([[0], [0], [1], [2]])
    np.testing.assert_allclose(client_task_tv(three, np.array([[2, 3]]), CLASSIFICATION, (3,)), [[0.5]])
    # Multi-label: task 0 = attributes (0, 1), task 1 = attribute 2; binary TV = |p - q|.
    attrs = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0], [0, 1, 0]])
    tv = client_task_tv(attrs, np.array([[0, 1]]), MultiLabel(((0, 1), (2,))), (2, 1))
    # task 0: attr 0 |1 - 1/2| = 1/2, attr 1 |1/2 - 1/2| = 0 -> 1/4; task 1: |1/2 - 1/4| = 1/4
    np.testing.assert_allclose(tv, [[0.25, 0.25]])


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
@pytest.mark.filterwarnings("ignore:the partition recycled")
def test_partition_stats_reports_the_heterogeneity_of_every_rule(celeba_root: Path) -> None:
    sets = ["--data-dir", str(celeba_root), "--set", "partition.clients=5", "--set", "partition.samples_per_client=12"]
    proc = fedhv("partition-stats", "celeba5-a", *sets, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    rows = {r["strata"]: r for r in report["heterogeneity"]}
    assert set(rows) == {"all-attributes", "task-representatives", "first-label"}
    assert rows["all-attributes"]["configured"] and rows["task-representatives"]["same_as"] == ["all-label"]
    bench = load_benchmark("celeba5", root=str(celeba_root))
    y = bench.train_y
    rates = y.mean(0)
    groups = [list(g) for g in bench.objective.groups]  # type: ignore[attr-defined]
    reps = [min(g, key=lambda a: (abs(rates[a] - 0.5), a)) for g in groups]
    for rule, columns in (("all-attributes", list(range(40))), ("task-representatives", reps),
                          ("first-label", [2, 20, 21])):
        strata = _bits(y, columns)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts = dirichlet_partition(strata, 5, 12, 0.15, 10)
        assert rows[rule]["strata_present"] == len(set(strata.tolist()))
        assert rows[rule]["mean_tv"] == pytest.approx(_tv_by_hand(y, parts, groups), abs=1e-12)
    assert 0 < report["iid"]["mean_tv"] < 1 and len(report["clients"]) == 5

    proc = fedhv("partition-stats", "celeba5-a", *sets, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    table = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert list(table[0]) == ["setting", "strata", "same_as", "configured", "strata_present", "task", "mean_tv",
                              "max_client_tv"]
    assert len(table) == 4 * 6  # 3 rules + iid, 5 tasks + "all"
    overall = {r["strata"]: float(r["mean_tv"]) for r in table if r["task"] == "all"}
    for rule in rows:
        assert overall[rule] == pytest.approx(rows[rule]["mean_tv"], abs=1e-6)

    text = fedhv("partition-stats", "celeba5-a", *sets).stdout
    assert "* all-attributes" in text and "  task-representatives = all-label" in text


@pytest.mark.needs_data
def test_partition_stats_validates_only_the_partition_keys(tmp_path: Path) -> None:
    proc = fedhv("partition-stats", "multimnist", "--set", "partition.clients=6",
                 "--set", "partition.samples_per_client=20")
    assert proc.returncode == 0, proc.stderr  # train.clients_per_round = 20 > 6 clients is not checked
    assert proc.stdout.startswith("multimnist: 6 clients x 20 samples")
    bad = fedhv("partition-stats", "multimnist", "--set", "partition.alpha=0")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: partition.alpha = 0")
    typo = fedhv("partition-stats", "multimnist", "--set", "partition.clientz=6")
    assert typo.returncode == 2 and "did you mean 'partition.clients'" in typo.stderr
    run = fedhv("run", "multimnist", "--set", "partition.clients=6", "--out", str(tmp_path / "r"))
    assert run.returncode == 2 and "train.clients_per_round = 20 must be between 1 and partition.clients = 6" \
        in run.stderr and not (tmp_path / "r").exists()


# -- item 2: which evaluation the tables report ----------------------------------------------------------


def _record(rnd: int, acc: tuple[float, float], loss: tuple[float, float]) -> dict[str, Any]:
    return {"round": rnd, "mean_acc": sum(acc) / 2, "worst_acc": min(acc), "mean_loss": sum(loss) / 2,
            "hv": (3 - loss[0]) * (3 - loss[1]), "task_acc": list(acc), "task_loss": list(loss)}


def _write_run(folder: Path, method: str, seed: int, at: dict[int, dict[str, Any]], final_round: int = 200) -> None:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'setting = "multimnist"\nmethod = "{method}"\nseed = {seed}\nrounds = 200\n'
                                        "\n[eval]\ntest_period = 3\n\n[train]\nclients_per_round = 20\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for _, r in sorted(at.items())))
    final = at[final_round]
    summary = {"setting": "multimnist", "method": method, "seed": seed, "rounds": 200, "tasks": ["left", "right"],
               "final_eval_round": final_round, **{k: v for k, v in final.items() if k != "round"}}
    (folder / "summary.json").write_text(json.dumps(summary))


#: Per (method, seed): (task accuracies, task losses) at the scheduled round 198 and the final round 200.
VALUES = {
    ("uniform", 0): (((60.0, 50.0), (0.50, 0.70)), ((70.0, 64.0), (0.40, 0.60))),
    ("uniform", 42): (((62.0, 52.0), (0.60, 0.80)), ((72.0, 66.0), (0.42, 0.62))),
    ("fedhv", 0): (((80.0, 76.0), (0.30, 0.34)), ((90.0, 86.0), (0.20, 0.24))),
    ("fedhv", 42): (((82.0, 78.0), (0.32, 0.36)), ((92.0, 88.0), (0.22, 0.26))),
}


def _grid(root: Path) -> Path:
    for (method, seed), (scheduled, final) in VALUES.items():
        _write_run(root / method / f"s{seed}", method, seed,
                   {195: _record(195, (1.0, 1.0), (2.9, 2.9)), 198: _record(198, *scheduled),
                    200: _record(200, *final)})
    return root


def test_final_result_tables_report_the_last_scheduled_evaluation(tmp_path: Path) -> None:
    root = _grid(tmp_path / "grid")
    # Table 1 MeanAcc, WorstAcc; Table 8 MeanLoss; Table 9 left accuracy -- means over seeds 0 and 42.
    at_198 = ["56.00", "51.00", "0.6500", "61.00", "79.00", "77.00", "0.3300", "81.00"]
    at_200 = ["68.00", "65.00", "0.5100", "71.00", "89.00", "87.00", "0.2300", "91.00"]
    scheduled = fedhv("table", str(root), "--table", "1,8,9")
    assert scheduled.returncode == 0, scheduled.stderr
    for value in at_198:
        assert value in scheduled.stdout, value
    rule = "last scheduled test evaluation (round 198 of 200), as in paper B.5"
    assert scheduled.stdout.count(rule) == 3  # one note in each of Tables 1, 8 and 9
    final = fedhv("table", str(root), "--table", "1,8,9", "--statistic", "final")
    assert final.returncode == 0, final.stderr
    for value in at_198:
        assert value not in final.stdout, value
    for value in at_200:
        assert value in final.stdout and value not in scheduled.stdout, value
    assert final.stdout.count("final test evaluation after the last round (round 200 of 200; --statistic final)") == 3


def test_a_run_missing_its_scheduled_evaluation_is_left_out_with_a_warning(tmp_path: Path) -> None:
    root = _grid(tmp_path / "grid")
    metrics = root / "fedhv" / "s42" / "metrics.jsonl"
    metrics.write_text("".join(ln + "\n" for ln in metrics.read_text().splitlines() if '"round": 198' not in ln))
    proc = fedhv("table", str(root), "--table", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"{metrics} has no test evaluation at round 198" in proc.stderr
    assert "78.00 (1 seed)" in proc.stdout  # FedHV MeanAcc of seed 0 alone, seed 42's final 90.00 not mixed in
