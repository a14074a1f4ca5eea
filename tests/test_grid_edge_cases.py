"""Issue 28, the grid's smaller defects.

- Two settings with the same file stem (``a/x.toml``, ``b/x.toml``) were planned into one folder
  and the grid never completed: refused before anything runs, naming both files; a setting
  given twice runs once.
- One worker killed (the out-of-memory killer, ``kill -9``) broke the process pool and every
  job was marked failed: the unfinished jobs run again in a new pool (resuming from their
  checkpoints), and a job that kills its worker even when it runs alone fails on its own.
  The workers here load user benchmarks (``tests/grid_kill_benchmark.py``) that ``SIGKILL``
  their own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.errors import ConfigError
from fedhv.experiment.grid import plan_grid

TINY = ("rounds = 3\n[partition]\nclients = 4\nsamples_per_client = 40\n[train]\nclients_per_round = 2\n"
        "batch_size = 8\nlocal_steps = 2\n[lr.uniform]\nglobal = 1.0\nlocal = 0.1\n[eval]\ntest_period = 1\n")


def _setting(path: Path, factory: str, name: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = f'setting = "{name}"\n' if name else ""
    path.write_text(head + TINY + f'[data]\nbenchmark = "grid_kill_benchmark:{factory}"\n')
    return path


def test_two_settings_of_one_name_are_refused_and_a_repeated_setting_runs_once(tmp_path: Path) -> None:
    a = _setting(tmp_path / "a" / "x.toml", "tiny")
    b = _setting(tmp_path / "b" / "x.toml", "tiny")
    with pytest.raises(ConfigError, match=r"settings .*a/x\.toml and .*b/x\.toml are both named 'x'.*another name"):
        plan_grid([str(a), str(b)], ["uniform"], [0], tmp_path / "grid")
    jobs, _ = plan_grid([str(a), str(a)], ["uniform"], [0, 1], tmp_path / "grid")
    assert sorted(j.run_dir for j in jobs) == [str(tmp_path / "grid" / "x" / "uniform" / f"s{s}") for s in (0, 1)]
    renamed = _setting(tmp_path / "c" / "x.toml", "tiny", name="x-c")
    jobs, _ = plan_grid([str(a), str(renamed)], ["uniform"], [0], tmp_path / "grid")
    assert len({j.run_dir for j in jobs}) == 2
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", str(a), str(b), "--methods", "uniform",
                          "--seeds", "0", "--out", str(tmp_path / "cli")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 2 and "both named 'x'" in res.stderr.strip().splitlines()[-1], res.stderr
    assert not (tmp_path / "cli").exists()


def _grid(tmp_path: Path, settings: list[Path], seeds: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDHV_TEST_KILL_MARK": str(tmp_path / "killed-once")}
    return subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", *map(str, settings), "--methods", "uniform",
                           "--seeds", seeds, "--workers", "2", "--out", str(tmp_path / "grid"), "--quiet"],
                          capture_output=True, text=True, timeout=600, check=False, env=env)


def test_a_killed_worker_costs_its_job_a_retry_not_the_grid(tmp_path: Path) -> None:
    """The first job's worker is killed while it loads its data: the grid warns once, runs the
    unfinished jobs again and finishes every one."""
    res = _grid(tmp_path, [_setting(tmp_path / "once.toml", "once")], "0,1,2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "killed-once").exists()  # the kill did happen
    assert "warning: a grid worker process was killed" in res.stdout + res.stderr
    for seed in (0, 1, 2):
        summary = json.loads((tmp_path / "grid" / "once" / "uniform" / f"s{seed}" / "summary.json").read_text())
        assert summary["mean_acc"] is not None


def test_a_job_that_kills_its_worker_alone_fails_alone(tmp_path: Path) -> None:
    """A job whose worker dies every time: after two broken pools it runs alone, fails with the cause
    named, and the other jobs finish."""
    res = _grid(tmp_path, [_setting(tmp_path / "always.toml", "always"), _setting(tmp_path / "tiny.toml", "tiny")],
                "0")
    assert res.returncode == 1, res.stdout + res.stderr
    failed = [line for line in res.stderr.splitlines() if line.strip().startswith("failed:")]
    assert len(failed) == 1 and "always/uniform/s0" in failed[0] and "out-of-memory killer" in failed[0], res.stderr
    assert (tmp_path / "grid" / "tiny" / "uniform" / "s0" / "summary.json").exists()
