"""End-to-end CLI runs on real data (small subsets) and traceback-free errors.

``fedhv run`` runs once as a real process; the errors, the statistics and the re-run from a
saved config.toml go through :func:`helpers.cli` (``fedhv.cli.main`` in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL
from helpers import cli

pytestmark = pytest.mark.needs_data  # every test here reads the real data


def fedhv(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _sets(*extra: str) -> list[str]:
    out = []
    for item in [*SMALL, *extra]:
        out += ["--set", item]
    return out


def test_run_writes_a_complete_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = fedhv("run", "multimnist", "--rounds", "3", "--out", str(out), "--quiet", *_sets())
    assert "MeanAcc" in proc.stdout
    for name in ("config.toml", "environment.json", "rounds.jsonl", "metrics.jsonl", "calibration.json",
                 "summary.json", "model.pt"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for key in ("method", "seed", "rounds", "mean_acc", "worst_acc", "mean_loss", "hv", "task_acc", "task_loss",
                "wall_clock_s", "bytes_down_per_client_round", "bytes_up_per_client_round", "reference"):
        assert summary[key] is not None, key
    assert summary["method"] == "fedhv" and summary["rounds"] == 3 and len(summary["task_acc"]) == 2
    # The aggregates follow from the per-task values (paper §5.1, C.1: HV with r_eval = 3 * 1).
    acc, loss = summary["task_acc"], summary["task_loss"]
    assert summary["mean_acc"] == pytest.approx(sum(acc) / 2) and summary["worst_acc"] == min(acc)
    assert summary["mean_loss"] == pytest.approx(sum(loss) / 2)
    assert summary["hv"] == pytest.approx((3 - loss[0]) * (3 - loss[1]))
    d = 28_515 + 2 * 3_060
    assert summary["bytes_down_per_client_round"] == summary["bytes_up_per_client_round"] == 4 * (d + 2)
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2, 3] and [m["round"] for m in metrics] == [1, 2, 3]
    assert rounds[1]["weights"] == rounds[0]["next_weights"]
    assert 0 < rounds[0]["wall_clock_s"] < rounds[2]["wall_clock_s"]
    assert summary["mean_acc"] == metrics[-1]["mean_acc"]
    cal = json.loads((out / "calibration.json").read_text())
    assert summary["reference"] == cal["reference"] and cal["rounds"] == 2
    # The saved config reproduces the run.
    again = tmp_path / "again"
    assert cli("run", str(out / "config.toml"), "--out", str(again), "--quiet").returncode == 0
    assert json.loads((again / "summary.json").read_text())["task_acc"] == summary["task_acc"]


def test_uniform_run_on_mnist_fmnist(tmp_path: Path) -> None:
    out = tmp_path / "u"
    fedhv("run", "mnist-fmnist", "--method", "uniform", "--rounds", "2", "--out", str(out), "--quiet", *_sets())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "uniform" and "reference" not in summary
    assert summary["bytes_up_per_client_round"] == summary["bytes_down_per_client_round"]
    assert not (out / "calibration.json").exists()


def test_partition_stats_prints_histograms() -> None:
    proc = cli("partition-stats", "multimnist")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "30 clients x 600 samples" in lines[0] and "100 present" in lines[0]
    rows = [ln for ln in lines if ln.strip().split(" ")[0].isdigit()]
    assert len(rows) == 60  # 30 clients x 2 tasks
    counts = [int(v) for v in rows[0].split()[1:11]]
    assert sum(counts) == 600


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--set", "train.lr_globl=1"], "did you mean 'train.lr_global'"),
        (["--set", "fedhv.rho_clip=0"], "fedhv.rho_clip = 0.0 must be > 0"),
        (["--set", "fedhv.reference=[2.5, 2.5, 2.5]"], "fedhv.reference has 3 values but multimnist has 2 tasks"),
        (["--set", "fedhv.reference=[0.5, 2.5]"], "non-positive slack at the initial model"),
        (["--set", "data.download=false", "--data-dir", "/nonexistent/fedhv-data"], "MNIST: missing"),
    ],
)
def test_errors_are_clear_and_traceback_free(args: list[str], expected: str, tmp_path: Path) -> None:
    # An empty derived-data cache, so that missing source files are noticed.
    env = {"FEDHV_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "run"
    proc = cli("run", "multimnist", "--rounds", "1", "--quiet", "--out", str(out), *_sets(), *args, env=env)
    assert proc.returncode == 2
    assert not out.exists()  # a failed start leaves no run directory behind
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
