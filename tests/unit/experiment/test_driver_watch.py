"""A local Ray instance's worker processes end with their driver, after the running task's
checkpoint (fedhv.experiment.grid_watch), shown on real processes without Ray: a "driver"
process, and a "worker" process that runs the setup hook as Ray's default worker would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from fedhv.experiment.grid_watch import DRIVER_ENV, EXIT_ORPHANED, parse_driver, runtime_env
from fedhv.procfs import start_ticks

#: The worker: runs the hook, then either idles or runs a task whose KeyboardInterrupt handler
#: takes CHECKPOINT_S to write its "checkpoint" (longer than Ray's old check left it, see the module).
WORKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from fedhv.experiment import grid_watch
    out = Path(sys.argv[1])
    grid_watch.setup_worker()
    (out / "ready").write_text("")
    if sys.argv[2] == "idle":
        while True:
            time.sleep(1)
    with grid_watch.task_scope():
        try:
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            time.sleep(float(sys.argv[3]))
            (out / "checkpoint").write_text("written")
            raise
""")


def _start(tmp_path: Path, mode: str, checkpoint_s: float = 0.0,
           sigint: Any = signal.SIG_DFL) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A driver and a worker; the worker starts with ``sigint`` as its SIGINT disposition (``SIG_DFL``:
    Python installs its handler; ``SIG_IGN``: as a grid started in the background passes it on)."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**os.environ, DRIVER_ENV: f"{driver.pid}:{start_ticks(driver.pid)}"}

    def signals() -> None:  # whatever the test process inherited: nothing blocked, SIGINT as asked
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signal.signal(signal.SIGINT, sigint)

    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), mode, str(checkpoint_s)], env=env,
                              stderr=subprocess.PIPE, preexec_fn=signals)  # noqa: PLW1509 - a test's own child
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert worker.poll() is None and time.monotonic() < deadline, worker.communicate()[1][-2000:]
        time.sleep(0.05)
    return driver, worker


def _orphan(driver: subprocess.Popen[bytes], worker: subprocess.Popen[bytes], timeout: float) -> float:
    """Kill the driver while the worker runs; seconds until the worker exited."""
    try:
        time.sleep(0.5)
        assert worker.poll() is None  # the driver lives: the worker runs on
        driver.kill()
        driver.wait()
        gone = time.monotonic()
        worker.wait(timeout=timeout)
        return time.monotonic() - gone
    finally:
        for p in (driver, worker):
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_a_running_task_checkpoints_before_its_worker_exits(tmp_path: Path, sigint: Any) -> None:
    driver, worker = _start(tmp_path, "task", checkpoint_s=3.0, sigint=sigint)
    took = _orphan(driver, worker, timeout=60)
    assert worker.returncode == EXIT_ORPHANED, worker.stderr.read()[-2000:] if worker.stderr else ""
    assert (tmp_path / "checkpoint").read_text() == "written"
    assert 3.0 <= took < 30.0  # waited for the checkpoint, then ended at once


def test_an_idle_worker_exits_as_soon_as_its_driver_is_gone(tmp_path: Path) -> None:
    driver, worker = _start(tmp_path, "idle")
    took = _orphan(driver, worker, timeout=30)
    assert worker.returncode == EXIT_ORPHANED
    assert took < 10.0
    assert not (tmp_path / "checkpoint").exists()


def test_without_a_driver_the_hook_does_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != DRIVER_ENV}
    code = "from fedhv.experiment import grid_watch, grid_watch as g; g.setup_worker(); print(g._started)"
    res = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_the_runtime_env_names_the_hook_and_the_driver() -> None:
    env = runtime_env(1234, 56789)
    assert env["worker_process_setup_hook"] == "fedhv.experiment.grid_watch.setup_worker"
    assert parse_driver(env["env_vars"][DRIVER_ENV]) == (1234, 56789)  # type: ignore[index]
    assert parse_driver("77:") == (77, None)


@pytest.mark.parametrize("bad", ["", "1234", "x:1", "1:y"])
def test_a_malformed_driver_variable_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=DRIVER_ENV):
        parse_driver(bad)
