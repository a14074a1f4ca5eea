"""Tests that kill surviving mutants of ``metrics/`` and ``results/collect.py`` (issue 11).

Oracles: hand-made run directories (no training) with the exact warning each damaged
file must produce, Table 11's "last ten scheduled evaluations" rule on hand-made
metrics, sample statistics by hand, and a fixed linear model whose per-task accuracy
and loss are computed by hand.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedhv.metrics.evaluate import evaluate_tasks
from fedhv.objectives import MultiLabel
from fedhv.results.collect import Run, Stat, find_runs, read_records

CONFIG = 'setting = "multimnist"\nmethod = "fedhv"\nseed = 1\n[eval]\ntest_period = 5\n[train]\nclients_per_round = 4\n'
SUMMARY: dict[str, Any] = {"setting": "multimnist", "method": "fedhv", "seed": 1, "tasks": ["L", "R"],
                           "mean_acc": 90.0, "task_acc": [89.0, 91.0]}


def _run(root: Path, name: str = "run", config: str = CONFIG, summary: Any = None,
         job: Any = None, metrics: list[str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(config)
    (folder / "summary.json").write_text(json.dumps(SUMMARY if summary is None else summary))
    if job is not None:
        (folder / "grid-job.json").write_text(json.dumps(job))
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    return folder


def _skips(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fedhv" and r.levelno == logging.WARNING]


@pytest.fixture(autouse=True)
def _propagate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fedhv")


# --------------------------------------------------------------------------- run directories


BAD_VARIANT = "'variant' is not [key, value], a front run's [\"front\", [u, delta]] or null"


@pytest.mark.parametrize(("config", "summary", "job", "file", "reason"), [
    (CONFIG.replace('setting = "multimnist"', "setting = 3"), None, None, "config.toml", "'setting' is not a string"),
    (CONFIG.replace("seed = 1", 'seed = "x"'), None, None, "config.toml", "'seed' is not an integer"),
    (CONFIG.replace("test_period = 5", 'test_period = "x"'), None, None, "config.toml",
     "eval.test_period is not an integer"),
    (CONFIG, {**SUMMARY, "method": 3}, None, "summary.json", "'method' is not a string"),
    (CONFIG, {**SUMMARY, "tasks": "a"}, None, "summary.json", "'tasks' is not a list of names"),
    (CONFIG, {**SUMMARY, "task_acc": ["x"]}, None, "summary.json", "'task_acc' is not a list of numbers"),
    (CONFIG, [1], None, "summary.json", "not a JSON object"),
    (CONFIG, None, [1], "grid-job.json", "not a JSON object"),
    (CONFIG, None, {"variant": [1]}, "grid-job.json", BAD_VARIANT),
    (CONFIG, None, {"variant": ["front", [[0.5, 0.0], 0.15]]}, "grid-job.json", BAD_VARIANT),
    (CONFIG, None, {"variant": ["front", [[0.5, 0.5], -1]]}, "grid-job.json", BAD_VARIANT),
    (CONFIG, None, {"ablation": 3}, "grid-job.json", "'ablation' is not a string"),
])
def test_damaged_file_is_skipped_with_its_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture, config: str,
                                                 summary: Any, job: Any, file: str, reason: str) -> None:
    bad = _run(tmp_path, "bad", config, summary, job)
    _run(tmp_path, "good")
    runs, unfinished = find_runs(tmp_path)
    assert [r.path.name for r in runs] == ["good"] and unfinished == []
    assert _skips(caplog) == [f"skipped {bad / file}: {reason} (run left out)"]


def test_config_without_eval_table_is_tabulated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _run(tmp_path, config='setting = "multimnist"\nmethod = "uniform"\n')
    runs, _ = find_runs(tmp_path)
    assert [r.method for r in runs] == ["fedhv"] and _skips(caplog) == []  # the summary's method wins
    assert runs[0].config_value("eval.test_period", 7) == 7


def test_grid_job_sets_variant_and_ablation(tmp_path: Path) -> None:
    _run(tmp_path, job={"variant": ["fedhv.rho_clip", 0.5], "ablation": "rho_clip"})
    (run,), _ = find_runs(tmp_path)
    assert run.variant == ("fedhv.rho_clip", 0.5) and run.ablation == "rho_clip"


def test_config_value_of_a_scalar_parent_is_the_default(tmp_path: Path) -> None:
    run = Run(tmp_path, {"a": 1, "b": {"c": 2}}, {})
    assert run.config_value("a.b", "dflt") == "dflt"
    assert run.config_value("b.c") == 2 and run.config_value("b.x") is None


def _evals(rounds: list[int]) -> list[str]:
    return [json.dumps({"round": r, "mean_acc": float(r)}) for r in rounds]


def test_last_scheduled_leaves_out_the_off_schedule_final_evaluation(tmp_path: Path) -> None:
    """test_period 5, evaluations at 5, 10, ..., 60 and the final round 63 (off schedule):
    Table 11 averages rounds 15..60 (the last ten scheduled)."""
    _run(tmp_path, metrics=_evals([*range(5, 61, 5), 63]))
    (run,), _ = find_runs(tmp_path)
    assert [e["round"] for e in run.last_scheduled()] == list(range(15, 61, 5))
    assert [e["round"] for e in run.last_scheduled(3)] == [50, 55, 60]


def test_read_records_names_the_damaged_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "rounds.jsonl"
    path.write_text('{"round": 1}\n{"round": 2\n[3]\n{"round": 4, "weights": ["w"]}\n{"round": 5}\n')
    assert [r["round"] for r in read_records(path)] == [1, 5]
    assert _skips(caplog) == [f"skipped {path} line 2: not valid JSON", f"skipped {path} line 3: not a JSON object",
                              f"skipped {path} line 4: 'weights' is not a list of numbers"]


def test_calibration_that_is_not_an_object_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _run(tmp_path)
    (folder / "calibration.json").write_text("[1]")
    (run,), _ = find_runs(tmp_path)
    assert run.calibration is None
    assert _skips(caplog) == [f"skipped {folder / 'calibration.json'}: not a JSON object"]


def test_stat_is_mean_and_sample_std() -> None:
    s = Stat.of([1.0, 2.0, 6.0, None, math.nan])
    assert s is not None and (s.mean, s.n, s.values) == (3.0, 3, (1.0, 2.0, 6.0))
    assert s.std == pytest.approx(math.sqrt((4 + 1 + 9) / 2), abs=1e-12)  # sample std (n - 1)
    one = Stat.of([4.0])
    assert one is not None and one.std is None and one.mean == 4.0
    assert Stat.of([None]) is None


# --------------------------------------------------------------------------- evaluation


class _Fixed(nn.Module):
    """Outputs fixed per-sample rows given by ``x``'s first column (an index into ``table``)."""

    def __init__(self, tables: list[torch.Tensor]) -> None:
        super().__init__()
        self.tables = tables

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        idx = x[:, 0].long()
        return [t[idx] for t in self.tables]


def test_evaluate_tasks_classification_by_hand() -> None:
    """4 samples, 2 tasks of 2 classes; log-probabilities log(0.8)/log(0.2) for the arg-max
    class. Task 0 right on 3 of 4 (75 %), task 1 right on 1 of 4 (25 %)."""
    lp = torch.log(torch.tensor([[0.8, 0.2], [0.2, 0.8]], dtype=torch.float64))
    model = _Fixed([lp[[0, 0, 1, 1]], lp[[1, 1, 1, 0]]])
    x = torch.arange(4, dtype=torch.float64)[:, None]
    y = torch.tensor([[0, 1], [0, 0], [1, 0], [0, 1]])
    acc, loss = evaluate_tasks(model, x, y, batch_size=3)
    assert acc == pytest.approx([75.0, 25.0], abs=1e-12)
    l8, l2 = -math.log(0.8), -math.log(0.2)
    assert loss == pytest.approx([(3 * l8 + l2) / 4, (l8 + 3 * l2) / 4], abs=1e-12)


def test_evaluate_tasks_multilabel_by_hand() -> None:
    """Task 0 = attributes (0, 1), task 1 = attribute (2); probabilities 0.9 / 0.3."""
    obj = MultiLabel(groups=((0, 1), (2,)))
    p = torch.tensor([[0.9, 0.3], [0.3, 0.9]], dtype=torch.float64)
    model = _Fixed([p, torch.tensor([[0.9], [0.9]], dtype=torch.float64)])
    x = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    y = torch.tensor([[1, 1, 1], [0, 1, 0]], dtype=torch.float64)
    acc, loss = evaluate_tasks(model, x, y, objective=obj)
    # task 0: sample 0 predicts (1, 0) vs (1, 1): 1/2; sample 1 predicts (0, 1) vs (0, 1): 1 -> 75 %
    # task 1: sample 0 right, sample 1 wrong -> 50 %
    assert acc == pytest.approx([75.0, 50.0], abs=1e-12)
    b9, b3 = -math.log(0.9), -math.log(0.3)  # BCE of a right 0.9 / a wrong 0.3 (= right 0.7: -log 0.7)
    b7, b1 = -math.log(0.7), -math.log(0.1)
    want0 = ((b9 + b3) / 2 + (b7 + b9) / 2) / 2
    assert loss == pytest.approx([want0, (b9 + b1) / 2], abs=1e-12)
