"""``fedhv tune`` end to end (issue 50, item 2), as commands of their own, on tiny MultiMNIST trials.

- A tuning killed with ``kill -9`` while a trial is paused after round 2 and rerun with the same command
  finishes with the budget's number of trials per method; the trials finished before the kill are not run
  again (their files untouched), the killed trial is failed and queued again with its parameters and run
  directory, which resumes from its round-2 checkpoint. Every trial's objective is the one its validation
  evaluations give (not its test evaluations'). The chosen configuration runs through ``fedhv grid``:
  each method's grid run repeats its best trial's evaluations exactly, and ``fedhv table`` groups the runs
  under MultiMNIST.
- The same on the Ray back-end (a local instance, loopback only, one CPU): the driver killed with
  ``kill -9`` while a trial is paused, its instance's processes gone afterwards (Ray's two agents aside,
  docs/cluster.md), the rerun finishes with every finished trial kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedhv.experiment.tune_space import objective_value
from fedhv.procfs import alive, descendants

from helpers import from_a_shell

pytestmark = pytest.mark.needs_data  # every test here reads the real data
pytest.importorskip("optuna", reason="fedhv tune needs Optuna: pip install -e '.[tune]'")

SETS = ["partition.clients=4", "partition.samples_per_client=32", "train.clients_per_round=2",
        "train.local_steps=2", "train.batch_size=16", "calibration.rounds=1", "data.max_test_samples=200",
        "data.val_fraction=0.02", "eval.test_period=1"]
TUNE = ["tune", "multimnist", "--methods", "uniform,stch", "--trials", "2", "--rounds", "3",
        *[x for s in SETS for x in ("--set", s)]]
RAY_AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent", b"ray/dashboard/agent.py",
              b"ray/_private/runtime_env/agent/main.py")  # as tests/e2e/grid/test_grid_ray.py


def _fedhv(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _kill_paused(args: list[str], env: dict[str, str], paused: Path) -> set[int]:
    """Start ``fedhv`` with ``args``, SIGKILL it once ``paused`` appears; the processes it had started."""
    driver = subprocess.Popen(from_a_shell([sys.executable, "-m", "fedhv.cli", *args]), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None and not paused.exists():
            seen |= descendants(driver.pid)
            time.sleep(0.2)
        assert paused.exists(), driver.communicate()[1][-3000:]
        seen |= descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == -signal.SIGKILL
    return seen


def _record(out: Path) -> dict[str, list[dict[str, object]]]:
    return {m: v["trials"] for m, v in json.loads((out / "record.json").read_text())["methods"].items()}


def _check_values_are_the_validation_objective(out: Path) -> None:
    for trials in _record(out).values():
        for t in trials:
            if t["state"] not in ("complete", "pruned"):
                continue
            entries = [json.loads(x) for x in (Path(t["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
            assert t["value"] == objective_value(entries, "mean-worst", 10)
            as_test = [{"round": e["round"], "val": {k: e[k] for k in ("mean_acc", "worst_acc")}} for e in entries]
            assert t["value"] != objective_value(as_test, "mean-worst", 10)  # the test metrics would give another


def _finished_files(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in out.glob("trials/*/t*/*")
            if (p.parent / "summary.json").exists()}


def test_a_tuning_killed_with_sigkill_resumes_and_its_choice_runs_through_the_grid(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    args = [*TUNE, "--pruner", "none", "--threads", "1", "--out", str(out)]  # no pruning: trial 1 reaches round 2
    env = {**os.environ, "FEDHV_TEST_PAUSE_AFTER_ROUND": "2", "FEDHV_TEST_PAUSE_RUN": "stch/t001"}
    _kill_paused(args, env, out / "trials" / "stch" / "t001" / ".test-paused")
    finished = _finished_files(out)
    assert {Path(p).parent.name for p in finished} == {"t000", "t001"} and len({Path(p).parent for p in finished}) == 3
    env.pop("FEDHV_TEST_PAUSE_AFTER_ROUND")
    res = _fedhv(*args, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "stch: trial 1 was running when its driver died; queued again" in res.stdout
    assert {p: v for p, v in _finished_files(out).items() if p in finished} == finished  # not run again
    record = _record(out)
    assert [(t["number"], t["state"]) for t in record["uniform"]] == [(0, "complete"), (1, "complete")]
    stch = {t["number"]: t for t in record["stch"]}
    assert [(n, t["state"], t["outcome"]) for n, t in stch.items()] == [
        (0, "complete", None), (1, "fail", "killed"), (2, "complete", None)]
    assert stch[2]["requeued_from"] == 1 and stch[2]["params"] == stch[1]["params"]
    assert stch[2]["run_dir"] == str(out / "trials" / "stch" / "t001")
    resumed = [json.loads(x) for x in (out / "trials" / "stch" / "t001" / "resumes.jsonl").read_text().splitlines()]
    assert [r["round"] for r in resumed] == [2]
    _check_values_are_the_validation_objective(out)
    assert _fedhv(*args, env=env).returncode == 0 and _record(out) == record  # nothing left to do: nothing runs

    grid = tmp_path / "grid"
    res = _fedhv("grid", str(out / "chosen.toml"), "--methods", "uniform,stch", "--seeds", "0", "--rounds", "3",
                 "--set", 'eval.splits=["test", "val"]', "--workers", "1", "--threads", "1", "--quiet",
                 "--out", str(grid), env=env)
    assert res.returncode == 0 and "2 run(s) finished" in res.stdout, res.stderr[-3000:]
    best = json.loads((out / "record.json").read_text())["methods"]
    for method in ("uniform", "stch"):
        def evals(run: Path) -> list[tuple[object, ...]]:
            lines = (run / "metrics.jsonl").read_text().splitlines()
            return [(e["round"], e["mean_acc"], e["worst_acc"], e["val"]) for e in map(json.loads, lines)]

        assert evals(grid / "multimnist" / method / "s0") == evals(Path(best[method]["best"]["run_dir"]))
    table = _fedhv("table", str(grid), "--table", "1", env=env)
    assert table.returncode == 0 and "| MultiMNIST |" in table.stdout and "[" not in table.stdout.split("|")[7], \
        table.stdout


def test_a_tuning_on_ray_killed_with_sigkill_resumes_on_a_loopback_instance(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray back-end needs ray: pip install -e '.[ray]'")
    out = tmp_path / "tune"
    args = [*TUNE, "--backend", "ray", "--num-cpus", "1", "--out", str(out)]  # one trial at a time: uniform's first
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="r", dir="/tmp"),
           "FEDHV_TEST_PAUSE_AFTER_ROUND": "2", "FEDHV_TEST_PAUSE_RUN": "stch/t000"}
    env.pop("RAY_ADDRESS", None)
    seen = _kill_paused(args, env, out / "trials" / "stch" / "t000" / ".test-paused")
    assert any(_cmdline(p).startswith(b"ray::") for p in seen), {p: _cmdline(p)[:80] for p in seen}
    finished = _finished_files(out)
    assert {str(Path(p).parent.relative_to(out)) for p in finished} == {"trials/uniform/t000"}
    gone_by, left = time.monotonic() + 60, seen
    while time.monotonic() < gone_by and left:
        left = {p for p in seen if alive(p) and not any(a in _cmdline(p) for a in RAY_AGENTS)}
        time.sleep(0.2)
    for p in seen:  # the agents of the killed driver's instance end on their own a minute later
        if alive(p) and any(a in _cmdline(p) for a in RAY_AGENTS):
            os.kill(p, signal.SIGKILL)
    assert not left, f"the local Ray instance outlived its driver: { {p: _cmdline(p)[:100] for p in left} }"
    assert (out / "trials" / "stch" / "t000" / "checkpoint.pt").exists()
    env.pop("FEDHV_TEST_PAUSE_AFTER_ROUND")
    res = _fedhv(*args, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert {p: v for p, v in _finished_files(out).items() if p in finished} == finished
    record = _record(out)
    counted = {m: sum(t["state"] in ("complete", "pruned") for t in trials) for m, trials in record.items()}
    assert counted == {"uniform": 2, "stch": 2}, record
    killed = [t for t in record["stch"] if t["outcome"] == "killed"]
    assert [t["number"] for t in killed] == [0]
    again = next(t for t in record["stch"] if t["requeued_from"] == 0)
    assert again["params"] == killed[0]["params"] and again["run_dir"] == str(out / "trials" / "stch" / "t000")
    resumed = (out / "trials" / "stch" / "t000" / "resumes.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in resumed] == [2]
    _check_values_are_the_validation_objective(out)
    assert (out / "chosen.toml").read_text().count("[lr.") == 2
