"""``fedhv flower`` as a real command: each test starts its own deployment through the CLI
(so they do not share the session ``flower_deployment`` of ``tests/e2e/flower/test_flower.py`` and run
on whichever xdist worker is free).

- ``fedhv flower export`` then ``fedhv flower local --node-data`` as real processes, 3 SuperNodes,
  FedHV, 2 rounds: a complete run directory equal to the simulator's that ``fedhv table`` reads,
  each node's file recorded with its SHA-256, no stray process (checked by PID);
- SIGTERM to ``fedhv flower local``: exit 143 and no process of it left;
- without flwr, ``fedhv flower local`` is a one-line error naming the install command.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedhv.config import load_config
from fedhv.experiment.runner import run_experiment
from flower_support import assert_gone, descendants, needs_flwr, rounds_of

from conftest import SMALL


def test_flower_command_without_flwr_is_a_one_line_error(tmp_path: Path) -> None:
    """``fedhv flower local`` without flwr installed: exit 2 and the install command, no traceback."""
    blocked = tmp_path / "site"
    (blocked / "flwr").mkdir(parents=True)
    (blocked / "flwr" / "__init__.py").write_text("raise ImportError('flwr is not installed (test)')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "2"],
                         capture_output=True, text=True, env=env, check=False, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: the Flower back-end needs flwr: pip install 'fedhv[flower]' (flwr==1.42.0)")
    assert "Traceback" not in res.stderr


@pytest.mark.needs_data
@needs_flwr
def test_flower_local_command_end_to_end(tmp_path: Path) -> None:
    """``fedhv flower local`` as a real process, each SuperNode serving its own data file (written by
    ``fedhv flower export``): run directory complete and equal to the simulator's, table reads it,
    no strays."""
    out = tmp_path / "run"
    sets = [x for item in [*SMALL, 'dtype="float64"', "calibration.rounds=1"] for x in ("--set", item)]
    export = subprocess.run([sys.executable, "-m", "fedhv.cli", "flower", "export", "multimnist", "--nodes", "3",
                             *sets, "--out", str(tmp_path / "node-data")], capture_output=True, text=True, check=False)
    assert export.returncode == 0, export.stderr
    cmd = [sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "3", "--rounds", "2",
           *sets, "--node-data", str(tmp_path / "node-data"), "--out", str(out), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[int] = set()
    while proc.poll() is None:  # every descendant, by PID, while it runs
        seen |= descendants(proc.pid)
        time.sleep(0.3)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output
    for name in ("config.toml", "environment.json", "calibration.json", "rounds.jsonl", "metrics.jsonl",
                 "summary.json", "model.pt"):
        assert (out / name).is_file(), name
    assert not (out / "checkpoint.pt").exists()
    assert len(rounds_of(out)) == 2 and "run directory:" in output
    assert json.loads((out / "summary.json").read_text())["engine"] == "sequential"  # what the nodes ran
    assert 'engine = "sequential"' in (out / "config.toml").read_text()  # and config.toml agrees
    argv = json.loads((out / "environment.json").read_text())["argv"]  # the ServerApp's (issue 29: its token)
    assert "--token" in argv and argv[argv.index("--token") + 1] == "<redacted>", argv
    served = json.loads((out / "environment.json").read_text())["clients"]
    assert sorted(served) == ["0", "1", "2"]
    for k, info in served.items():  # the run records which file each node served
        path = tmp_path / "node-data" / f"client-{k}.npz"
        assert info["node_file"] == str(path) and info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    sim = tmp_path / "sim"  # the nodes' own files hold exactly the simulator's partitions
    run_experiment(load_config("multimnist", [*SMALL, 'dtype="float64"', "calibration.rounds=1", "partition.clients=3",
                                              "rounds=2",
                                              "train.clients_per_round=3"]), sim, progress=False)
    for a, b in zip(rounds_of(out), rounds_of(sim), strict=True):
        assert a["clients"] == b["clients"]
        np.testing.assert_allclose(a["report"], b["report"], rtol=1e-9)
        np.testing.assert_allclose(a["weights"], b["weights"], rtol=1e-9)
    table = subprocess.run([sys.executable, "-m", "fedhv.cli", "table", str(out), "--table", "1"],
                           capture_output=True, text=True, check=False)
    assert table.returncode == 0 and "fedhv" in table.stdout.lower(), table.stdout + table.stderr
    assert len(seen) >= 1 + 2 * 3  # SuperLink, 3 SuperNodes, 3 ClientApp processes (and the ServerApp)
    assert_gone(seen)


@pytest.mark.needs_data
@needs_flwr
def test_flower_local_sigterm_stops_every_process(tmp_path: Path) -> None:
    """SIGTERM to ``fedhv flower local`` mid-start: exit 143, and every process it started is gone."""
    sets = [x for item in SMALL for x in ("--set", item)]
    cmd = [sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "2", "--rounds", "50",
           *sets, "--out", str(tmp_path / "run"), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= descendants(proc.pid)
        if len(seen) >= 5:  # SuperLink, 2 SuperNodes, 2 ClientApp processes
            break
        time.sleep(0.2)
    assert proc.poll() is None and len(seen) >= 5, seen
    proc.terminate()
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, output
    assert "terminated (signal 15)" in output
    assert_gone(seen)
