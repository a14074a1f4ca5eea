"""``fedhv grid``'s plan, before any run: settings, refusals, re-runs and shared calibrations.

- Two settings with the same file stem (``a/x.toml``, ``b/x.toml``) were planned into one folder
  and the grid never completed (issue 28): refused before anything runs, naming both files; a
  setting given twice runs once.
- A TOML setting given by a relative path, a re-run with other arguments, bad input and a
  summary line without test metrics (issue 10).
- Calibrations are shared exactly where the paper shares them (B.8).

The grid's worker processes (kills, Ctrl-C / SIGTERM) are tested in
``tests/e2e/grid/test_grid_processes.py``; the tables and figures of a grid in
``tests/unit/results/test_grid_tables.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.cli import main
from fedhv.errors import ConfigError
from fedhv.experiment.grid import plan_grid
from grid_kill_benchmark import write_setting

from conftest import SMALL

SETS = [a for o in SMALL for a in ("--set", o)]


def test_two_settings_of_one_name_are_refused_and_a_repeated_setting_runs_once(tmp_path: Path) -> None:
    a = write_setting(tmp_path / "a" / "x.toml", "tiny")
    b = write_setting(tmp_path / "b" / "x.toml", "tiny")
    with pytest.raises(ConfigError, match=r"settings .*a/x\.toml and .*b/x\.toml are both named 'x'.*another name"):
        plan_grid([str(a), str(b)], ["uniform"], [0], tmp_path / "grid")
    jobs, _ = plan_grid([str(a), str(a)], ["uniform"], [0, 1], tmp_path / "grid")
    assert sorted(j.run_dir for j in jobs) == [str(tmp_path / "grid" / "x" / "uniform" / f"s{s}") for s in (0, 1)]
    renamed = write_setting(tmp_path / "c" / "x.toml", "tiny", name="x-c")
    jobs, _ = plan_grid([str(a), str(renamed)], ["uniform"], [0], tmp_path / "grid")
    assert len({j.run_dir for j in jobs}) == 2
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", str(a), str(b), "--methods", "uniform",
                          "--seeds", "0", "--out", str(tmp_path / "cli")], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 2 and "both named 'x'" in res.stderr.strip().splitlines()[-1], res.stderr
    assert not (tmp_path / "cli").exists()


@pytest.mark.needs_data
def test_grid_runs_a_toml_setting_given_by_a_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 10.2: jobs stored the file's stem ('mine') instead of its path and all failed."""
    (tmp_path / "settings").mkdir()
    (tmp_path / "settings" / "mine.toml").write_text('extends = "multimnist"\n[train]\nlocal_steps = 2\n')
    monkeypatch.chdir(tmp_path)
    argv = ["grid", "settings/mine.toml", "--methods", "fedhv", "--seeds", "0", "--rounds", "1",
            "--out", "g", "--workers", "1", "--threads", "1", "--quiet", *SETS]
    assert main(argv) == 0, capsys.readouterr().err
    # The calibration and the run both load the file; the run folder is named after the setting.
    assert (tmp_path / "g" / "mine" / "fedhv" / "s0" / "summary.json").exists()
    assert len(list((tmp_path / "g" / "calibration").glob("*.json"))) == 1
    grid = json.loads((tmp_path / "g" / "grid.json").read_text())
    sources = {j["source"] for j in grid["jobs"]} | {c["source"] for c in grid["calibrations"]}
    assert sources == {str(tmp_path / "settings" / "mine.toml")}  # absolute: resolves in any worker


@pytest.mark.needs_data
def test_rerun_with_other_arguments_is_refused_before_running(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 10.5: a re-run with other --rounds / --set reported stale runs as 'already done'."""
    out = tmp_path / "g"
    base = ["grid", "multimnist", "--methods", "uniform", "--seeds", "0", "--out", str(out),
            "--workers", "1", "--threads", "1", "--quiet", *SETS]
    assert main([*base, "--rounds", "2"]) == 0
    run = out / "multimnist" / "uniform" / "s0"
    grid_json = (out / "grid.json").read_bytes()
    summary = (run / "summary.json").read_bytes()
    capsys.readouterr()

    assert main([*base, "--rounds", "3"]) == 2
    err = capsys.readouterr().err
    assert f"{run}" in err and "rounds = 2 in the run, 3 in this grid" in err
    assert (out / "grid.json").read_bytes() == grid_json and (run / "summary.json").read_bytes() == summary

    # A partial run (no summary.json) is compared too.
    (run / "summary.json").rename(tmp_path / "summary.json")
    assert main([*base, "--rounds", "2", "--set", "train.local_steps=2"]) == 2
    assert "train.local_steps = 3 in the run, 2 in this grid" in capsys.readouterr().err
    assert not (run / "summary.json").exists() and (out / "grid.json").read_bytes() == grid_json
    (tmp_path / "summary.json").rename(run / "summary.json")

    # Where the (checksum-verified) data lives does not change results: still done.
    link = tmp_path / "data-link"
    link.symlink_to(os.environ["FEDHV_DATA"])
    assert main([*base, "--rounds", "2", "--data-dir", str(link)]) == 0
    assert "0 run(s) finished, 1 already done, 0 failed" in capsys.readouterr().out


def test_grid_summary_line_survives_missing_metrics() -> None:
    """Issue 10.12: the driver crashed formatting ``summary['mean_acc'] = None``.

    Configurations that evaluate no test split are now refused up front (``eval.splits``,
    ``eval.final``), so the line is checked on the summary such a run wrote.
    """
    from fedhv.experiment.grid import _summary_line

    summary = {"mean_acc": None, "worst_acc": None, "wall_clock_s": 3.2}
    assert _summary_line("g/x/s0", summary) == "done: g/x/s0: MeanAcc n/a WorstAcc n/a (3 s)"
    summary = {"mean_acc": 91.234, "worst_acc": 90.0, "wall_clock_s": 12.6}
    assert _summary_line("g/x/s0", summary) == "done: g/x/s0: MeanAcc 91.23 WorstAcc 90.00 (13 s)"


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
    _, cals = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path, ["calibration.rounds=10"])
    _, cals_default = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path)
    assert cals[0].path != cals_default[0].path  # a different calibration is not reused
    # the margin only shifts r = max F + margin, which each run applies itself: one calibration for every margin
    _, cals_margin = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path, ["calibration.margin=0.3"])
    assert [c.path for c in cals_margin] == [c.path for c in cals_default]


def test_the_server_lr_sweep_scales_each_methods_own_rate(tmp_path: Path) -> None:
    """``--ablation server-lr``: every method at half and twice its own resolved eta_g (FedHV's preset rate for
    the loss-only methods, FSMGDA's for the FSMGDA-exchange ones); not part of ``--ablation all``."""
    jobs, _ = plan_grid(["multimnist"], ["fedhv", "dwa", "fsmgda", "fsmgda-upgrad", "uniform"], [0],
                        tmp_path / "g", ablation="server-lr")
    got = {(j.method, j.variant[1]): float(next(o for o in j.overrides if o.startswith("train.lr_global="))
                                           .split("=")[1]) for j in jobs}
    assert got == {("fedhv", 0.5): 0.6, ("fedhv", 2.0): 2.4, ("dwa", 0.5): 0.6, ("dwa", 2.0): 2.4,
                   ("fsmgda", 0.5): 1.0, ("fsmgda", 2.0): 4.0, ("fsmgda-upgrad", 0.5): 1.0,
                   ("fsmgda-upgrad", 2.0): 4.0, ("uniform", 0.5): 0.5, ("uniform", 2.0): 2.0}
    assert {j.variant[0] for j in jobs} == {"lr_global_factor"}
    assert {Path(j.run_dir).parent.parent.name for j in jobs} == {"lr_global_factor=0.5", "lr_global_factor=2.0"}
    everything, _ = plan_grid(["multimnist"], ["fedhv"], [0], tmp_path / "h", ablation="all")
    assert {j.ablation for j in everything} == {"report-budget", "participation", "local-steps"}
