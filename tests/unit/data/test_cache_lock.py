"""Concurrent processes sharing one data cache build each entry once (``fedhv.data.cache``).

Real processes (not threads: ``flock`` locks belong to open file descriptions, and the
case that matters is a grid's worker processes or parallel test workers). The build
function records each call in a file, so the test counts builds independently of the
cache's own status reports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BUILDER = """
import os, sys, time
from pathlib import Path
import numpy as np
from fedhv.data.cache import fetch_arrays
log, pause = Path(sys.argv[1]), float(sys.argv[2])
def build():
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    time.sleep(pause)
    return {"x": np.arange(5) * 7}
arrays, info = fetch_arrays("thing", "k", build)
assert arrays["x"].tolist() == [0, 7, 14, 21, 28]
print(info["status"])
"""


def _start(tmp_path: Path, pause: float) -> subprocess.Popen[str]:
    env = {**os.environ, "FEDHV_CACHE": str(tmp_path / "cache")}
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path / "builds.log"), str(pause)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().split() if log.exists() else []


def test_two_processes_build_one_entry_once(tmp_path: Path) -> None:
    """The second process waits for the first one's build and loads its file."""
    first = _start(tmp_path, 2.0)
    deadline = time.monotonic() + 60
    while not _builds(tmp_path):  # the first one is building (holds the lock)
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = _start(tmp_path, 2.0)
    outs = [p.communicate(timeout=120) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert _builds(tmp_path) == [str(first.pid)]  # built once, by the first
    assert [o[0].strip() for o in outs] == ["built", "loaded"]


def test_a_killed_builder_does_not_block_the_next(tmp_path: Path) -> None:
    """kill -9 while holding the lock: the kernel drops the lock, the next process builds."""
    first = _start(tmp_path, 60.0)
    deadline = time.monotonic() + 60
    while not _builds(tmp_path):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    second = _start(tmp_path, 0.0)
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert out.strip() == "built" and _builds(tmp_path) == [str(first.pid), str(second.pid)]
