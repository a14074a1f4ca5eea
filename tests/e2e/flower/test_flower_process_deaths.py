"""Issue 28 item 4, the deployment's other deaths (split from ``test_flower_process_lifetime.py`` so the two
files' Flower runs go to both xdist workers):

- ``kill -9`` of the SuperLink mid-run: the launcher exits with an error naming it and, when it
  returns, the ServerApp (in a session of its own, which ignores SIGTERM while it retries) is gone
  and the lock is free, so ``--resume`` finishes at once;
- Ctrl-C (``SIGINT``) of the launcher mid-run: exit 130, the same guarantees.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from e2e.flower.test_flower_process_lifetime import (
    _assert_all_gone,
    _cmdline,
    _flower_cmd,
    _lines,
    _resume_cmd,
    _token,
    _until,
)
from flower_support import needs_flwr, rounds_of

from helpers import from_a_shell, signal_state

pytestmark = pytest.mark.needs_data  # every test here reads the real data


@needs_flwr
def test_kill9_of_the_superlink_stops_the_serverapp_and_frees_the_lock(tmp_path: Path) -> None:
    """The SuperLink dies mid-run: the launcher exits with an error naming it, the ServerApp (in a
    session of its own, which ignores SIGTERM while it retries) is gone, and ``--resume`` finishes."""
    out = tmp_path / "run"
    proc = subprocess.Popen(_flower_cmd(out, 4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = _until(proc, lambda: _lines(out / "rounds.jsonl") >= 1)
    token = _token(seen)
    link = [p for p in seen if b"flower-superlink" in _cmdline(p)]
    assert len(link) == 1
    os.kill(link[0], signal.SIGKILL)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "superlink" in output, output
    _assert_all_gone(seen, token, at_once=True)
    again = subprocess.run(_resume_cmd(out), capture_output=True, text=True, check=False, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(rounds_of(out)) == 4 and json.loads((out / "summary.json").read_text())


@needs_flwr
def test_ctrl_c_mid_run_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) after the first round: exit 130, and when the launcher returns no process of the
    deployment runs (the ServerApp included) and the run directory's lock is free."""
    from fedhv.results.rundir import RunDir

    out = tmp_path / "run"
    proc = subprocess.Popen(from_a_shell(_flower_cmd(out, 50)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = _until(proc, lambda: _lines(out / "rounds.jsonl") >= 1)
    token = _token(seen)
    assert any(b"flwr-serverapp" in _cmdline(p) for p in seen)
    state = f"test process {signal_state(os.getpid())}; launcher {signal_state(proc.pid)}"
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, (state, output)
    _assert_all_gone(seen, token, at_once=True)
    RunDir(out).close()
