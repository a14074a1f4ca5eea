"""``fedhv grid``'s worker processes: they die with the grid, Ctrl-C / SIGTERM stop the queue, and a
killed worker costs its job a retry, not the grid.

- (issue 10) the tests start a real ``fedhv grid`` (small settings, enough rounds to still be
  running), find its worker processes through ``/proc`` and signal them by PID only;
- (issue 28) one worker killed (the out-of-memory killer, ``kill -9``) broke the process pool and
  every job was marked failed: the unfinished jobs run again in a new pool (resuming from their
  checkpoints), and a job that kills its worker even when it runs alone fails on its own. The
  workers load user benchmarks (``tests/support/grid_kill_benchmark.py``) that ``SIGKILL`` their
  own process.
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

from fedhv.results.rundir import read_jsonl
from grid_kill_benchmark import write_setting

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


@pytest.mark.needs_data
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


@pytest.mark.needs_data
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


def _grid(tmp_path: Path, settings: list[Path], seeds: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDHV_TEST_KILL_MARK": str(tmp_path / "killed-once")}
    return subprocess.run([sys.executable, "-m", "fedhv.cli", "grid", *map(str, settings), "--methods", "uniform",
                           "--seeds", seeds, "--workers", "2", "--out", str(tmp_path / "grid"), "--quiet"],
                          capture_output=True, text=True, timeout=600, check=False, env=env)


def test_a_killed_worker_costs_its_job_a_retry_not_the_grid(tmp_path: Path) -> None:
    """The first job's worker is killed while it loads its data: the grid warns once, runs the
    unfinished jobs again and finishes every one."""
    res = _grid(tmp_path, [write_setting(tmp_path / "once.toml", "once")], "0,1,2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "killed-once").exists()  # the kill did happen
    assert "warning: a grid worker process was killed" in res.stdout + res.stderr
    for seed in (0, 1, 2):
        summary = json.loads((tmp_path / "grid" / "once" / "uniform" / f"s{seed}" / "summary.json").read_text())
        assert summary["mean_acc"] is not None


def test_a_job_that_kills_its_worker_alone_fails_alone(tmp_path: Path) -> None:
    """A job whose worker dies every time: after two broken pools it runs alone, fails with the cause
    named, and the other jobs finish."""
    res = _grid(tmp_path, [write_setting(tmp_path / "always.toml", "always"), write_setting(tmp_path / "tiny.toml", "tiny")],
                "0")
    assert res.returncode == 1, res.stdout + res.stderr
    failed = [line for line in res.stderr.splitlines() if line.strip().startswith("failed:")]
    assert len(failed) == 1 and "always/uniform/s0" in failed[0] and "out-of-memory killer" in failed[0], res.stderr
    assert (tmp_path / "grid" / "tiny" / "uniform" / "s0" / "summary.json").exists()
