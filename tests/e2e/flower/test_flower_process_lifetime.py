"""Issue 28 item 4: every process of a local Flower deployment dies with it, whatever kills the launcher.

- the long-lived ClientApp process exits when its SuperNode is gone, also while Flower's HTTP
  client retries a Runtime API that never answers and when the parent is an unreaped zombie;
- :func:`fedhv.flower.lifetime.sweep` stops marked processes in sessions of their own that
  ignore ``SIGTERM``; the watchdog does so (and removes the work directory) when its launcher
  is killed with ``SIGKILL``;
- ``fedhv flower local`` as a real process: ``kill -9`` mid-run leaves no process (by PID and
  by mark) and ``--resume`` ends bit-identical to the simulator's float64 run (the SuperLink's
  death and Ctrl-C: ``test_flower_process_deaths.py``);
- ``--resume`` of a directory another process holds is refused before any process starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fedhv.config import load_config
from fedhv.experiment.runner import run_experiment
from fedhv.flower.lifetime import MARK, alive, marked, sweep
from flower_support import assert_gone, descendants, needs_flwr, rounds_of, theta_of

from conftest import SMALL

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"


def _wait(cond: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return bool(cond())  # type: ignore[operator]


@needs_flwr
def test_clientapp_process_exits_when_its_supernode_is_a_zombie(tmp_path: Path) -> None:
    """The issue's repro: the parent exits (here left unreaped, a zombie) and nothing listens on the
    Runtime API address; before, Flower's retry loop never returned and the process ran on."""
    from fedhv.flower.procs import free_ports

    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])  # not reaped until the end
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "fedhv.flower.executor", "--runtime-api-address",
                             f"127.0.0.1:{port}", "--parent-pid", str(parent.pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: proc.poll() is not None, 30), "the ClientApp process outlived its SuperNode"
        assert proc.returncode == 0
        assert not alive(parent.pid)  # a zombie is gone to fedhv
    finally:
        proc.kill()
        proc.wait()
        parent.wait()


def _marked_stubborn(token: str) -> subprocess.Popen[str]:
    """A process with the mark, in its own session, that ignores SIGTERM (once it returns)."""
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], env={**os.environ, MARK: token},
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_sweep_stops_marked_processes_that_ignore_sigterm() -> None:
    """Marked processes in their own sessions, ignoring SIGTERM, are found and killed; an unmarked
    one (another deployment's mark) is left alone."""
    mine = [_marked_stubborn("t-mine") for _ in range(2)]
    other = _marked_stubborn("t-other")
    try:
        assert _wait(lambda: len(marked("t-mine")) == 2)
        assert sorted(marked("t-mine")) == sorted(p.pid for p in mine)
        t0 = time.monotonic()
        sweep("t-mine", grace_s=0.5)
        for p in mine:
            p.wait(timeout=10)
        assert [p.returncode for p in mine] == [-signal.SIGKILL] * 2
        assert time.monotonic() - t0 < 10
        assert other.poll() is None and marked("t-other") == [other.pid]
    finally:
        for p in [*mine, other]:
            p.kill()
            p.wait()


def test_sweep_stops_unmarked_descendants_of_marked_processes() -> None:
    """As Ray's agents under a raylet: a marked process starts a child without the mark; the sweep
    stops the child too (before, killing the marked parent orphaned it)."""
    code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = {{k: v for k, v in os.environ.items() if k != {MARK!r}}}
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, MARK: "t-tree"},
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert marked("t-tree") == [parent.pid] and alive(child)
        sweep("t-tree", grace_s=0.5)
        parent.wait(timeout=10)
        assert _wait(lambda: not alive(child)), "the unmarked child outlived the sweep"
    finally:
        parent.kill()
        parent.wait()


def test_watchdog_sweeps_when_its_launcher_is_killed(tmp_path: Path) -> None:
    """A launcher starts the watchdog and a marked, SIGTERM-ignoring process in a session of its own
    (as flwr's SuperExec starts the ServerApp), then dies by SIGKILL: the process and the work
    directory are gone."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "key.pem").write_text("secret")
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys, time
        env = {{**os.environ, {MARK!r}: "t-dog"}}
        subprocess.Popen([sys.executable, "-m", "fedhv.flower.lifetime", "--token", "t-dog", "--parent",
                          str(os.getpid()), "--workdir", {str(work)!r}], start_new_session=True)
        child = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], env=env, start_new_session=True,
                                 stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())  # type: ignore[union-attr]
    seen = descendants(proc.pid) | {child}
    try:
        assert _wait(lambda: marked("t-dog") == [child]) and alive(child)
        proc.kill()
        proc.wait()
        assert_gone(seen)
        assert _wait(lambda: not work.exists(), 10), "the watchdog left the work directory"
    finally:
        sweep("t-dog", grace_s=0.1)


def _sets() -> list[str]:
    return [*SMALL, "partition.clients=2", "train.clients_per_round=2", 'dtype="float64"', "calibration.rounds=2"]


def _flower_cmd(out: Path, rounds: int) -> list[str]:
    sets = [x for item in _sets() for x in ("--set", item)]
    return [sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "2", "--rounds", str(rounds),
            *sets, "--out", str(out), "--quiet"]


def _resume_cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "fedhv.cli", "flower", "local", "--resume", str(out), "--quiet"]


def _token(pids: set[int]) -> str | None:
    from fedhv.flower.lifetime import mark_of

    return mark_of(pids)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _lines(path: Path) -> int:
    """Complete lines of a file being written (0 while it does not exist)."""
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _until(proc: subprocess.Popen[str], cond: object, timeout: float = 300) -> set[int]:
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= descendants(proc.pid)
        if cond():  # type: ignore[operator]
            return seen | descendants(proc.pid)
        time.sleep(0.05)
    raise AssertionError(f"the moment never came (status {proc.poll()})")


def _assert_all_gone(seen: set[int], token: str | None, at_once: bool = False) -> None:
    """No process seen (and none with the deployment's mark) runs: within 10 s, or ``at_once``
    (the launcher returned only after every process was gone)."""
    if at_once:
        assert not [p for p in seen if alive(p)], f"running after the launcher exited: {[p for p in seen if alive(p)]}"
    assert_gone(seen)
    assert token is not None
    assert _wait(lambda: not marked(token), 15), f"marked processes left: {marked(token)}"


@pytest.mark.needs_data
@needs_flwr
def test_kill9_of_flower_local_leaves_nothing_and_resume_is_bit_identical(tmp_path: Path) -> None:
    """``kill -9`` of the launcher after 2 of 4 rounds: every process it (and Flower) started is gone,
    the run directory is not written any more, and ``--resume`` ends with the simulator's rounds
    and model, bit for bit."""
    out, rounds = tmp_path / "run", 4
    proc = subprocess.Popen(_flower_cmd(out, rounds), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = _until(proc, lambda: _lines(out / "rounds.jsonl") >= 2)
    token = _token(seen)
    proc.kill()
    proc.communicate(timeout=60)
    _assert_all_gone(seen, token)
    frozen = (out / "rounds.jsonl").read_bytes()
    time.sleep(1.0)
    assert (out / "rounds.jsonl").read_bytes() == frozen and not (out / "summary.json").exists()
    again = subprocess.run(_resume_cmd(out), capture_output=True, text=True, check=False, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    sim = tmp_path / "sim"
    run_experiment(load_config("multimnist", [*_sets(), f"rounds={rounds}", 'engine="sequential"']), sim, progress=False)
    got, want = rounds_of(out), rounds_of(sim)
    assert [r["clients"] for r in got] == [r["clients"] for r in want]
    assert [r["report"] for r in got] == [r["report"] for r in want]
    assert [r["weights"] for r in got] == [r["weights"] for r in want]
    assert torch.equal(theta_of(out), theta_of(sim))


@pytest.mark.needs_data
@needs_flwr
def test_resume_of_a_busy_run_directory_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    """Another process holds the run directory: ``--resume`` says so (exit 2) and starts no
    deployment (no ``fedhv-flower-*`` work directory appears in its temporary folder)."""
    from fedhv.results.rundir import RunDir

    out = tmp_path / "run"
    run_experiment(load_config("multimnist", [*_sets(), "rounds=1"]), out, progress=False)
    (out / "summary.json").unlink()  # an unfinished run to resume
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    holder = RunDir(out)
    try:
        res = subprocess.run(_resume_cmd(out), capture_output=True, text=True, check=False, timeout=120,
                             env={**os.environ, "TMPDIR": str(tmp)})
    finally:
        holder.close()
    assert res.returncode == 2, res.stdout + res.stderr
    assert "in use by another fedhv process" in res.stderr and f"pid {os.getpid()}" in res.stderr
    assert not list(tmp.glob("fedhv-flower-*"))
