"""``fedhv grid`` safety: TOML settings, workers that die with the grid, Ctrl-C / SIGTERM,
stale runs, runs without test metrics.

The process tests start a real ``fedhv grid`` (small settings, enough rounds to still be
running), find its worker processes through ``/proc`` and signal them by PID only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhv.cli import main
from fedhv.results.rundir import read_jsonl

from conftest import REPO, SMALL

SETS = [a for o in SMALL for a in ("--set", o)]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _grid_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "fedhv.cli", "grid", "multimnist", "--methods", "uniform", "--out", str(out),
            "--workers", "1", "--threads", "1", "--quiet", *SETS, *args]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return None if state in ("Z", "X") else (state, int(ppid))


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid:
                out.append(int(entry.name))
    return out


def _wait_for_rounds(proc: subprocess.Popen[bytes], run: Path, rounds: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(read_jsonl(run / "rounds.jsonl")) < rounds:
        if proc.poll() is not None:
            pytest.fail(f"the grid ended (status {proc.returncode}) before run {run} reached round {rounds}")
        if time.monotonic() > deadline:
            pytest.fail(f"run {run} did not reach round {rounds} in {timeout} s")
        time.sleep(0.05)


def _alive_after(pids: list[int], seconds: float) -> list[int]:
    """The processes of ``pids`` still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while any(_stat(p) is not None for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _stat(p) is not None]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _stat(pid) is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


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


@linux_only
def test_workers_die_with_a_killed_grid(tmp_path: Path) -> None:
    """Issue 10.3: ``kill -9`` of the grid left its workers running (two writers on a re-run)."""
    out = tmp_path / "g"
    proc = subprocess.Popen(_grid_cmd(out, "--seeds", "0", "--rounds", "400"), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        _wait_for_rounds(proc, out / "multimnist" / "uniform" / "s0", 2)
        workers = _children(proc.pid)
        assert workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _alive_after(workers, 10) == []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        _kill_all(workers)
    # The running run kept its rounds and a checkpoint; it is not finished.
    run = out / "multimnist" / "uniform" / "s0"
    assert (run / "checkpoint.pt").exists() and not (run / "summary.json").exists()


@linux_only
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stop_cancels_the_queue_and_checkpoints_the_running_run(tmp_path: Path, how: str) -> None:
    """Issue 10.4: Ctrl-C stopped only the running jobs; queued ones still ran to the end.

    ``ctrl-c`` sends SIGINT to the grid's whole process group (what a terminal does; exit
    130); ``sigterm`` sends SIGTERM to the grid process only, which must pass the stop on
    to its workers (exit 143, as ``fedhv run``).
    """
    out = tmp_path / "g"
    proc = subprocess.Popen(_grid_cmd(out, "--seeds", "0,1,2", "--rounds", "400"), env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    workers: list[int] = []
    try:
        first = out / "multimnist" / "uniform" / "s0"
        _wait_for_rounds(proc, first, 2)
        workers = _children(proc.pid)
        stopped_at = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        seconds = time.monotonic() - stopped_at
        alive = _alive_after(workers, 5)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        _kill_all(workers)
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err.decode()
    assert seconds < 20
    assert alive == []
    for seed in (1, 2):  # queued jobs never started
        assert not (out / "multimnist" / "uniform" / f"s{seed}" / "config.toml").exists()
    kept = len(read_jsonl(first / "rounds.jsonl"))
    assert 2 <= kept < 400 and not (first / "summary.json").exists()
    assert (first / "checkpoint.pt").exists()


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
