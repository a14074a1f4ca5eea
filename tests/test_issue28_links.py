"""Issue 28, item 1: fedhv never follows a symbolic link in a run directory.

On the code before this stop: a planted ``.lock`` link made ``fedhv run --resume`` (and a new
``--out``) truncate the link's target and write a pid into it; a ``metrics.jsonl`` link in an
unfinished run without a checkpoint made the resume truncate the target and append to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL

SETS = [a for o in [*SMALL, "rounds=2", "calibration.rounds=1", "checkpoint.enabled=false"] for a in ("--set", o)]


def _fedhv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True, timeout=300,
                          check=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "r"
    done = _fedhv("run", "multimnist", "--method", "uniform", "--out", str(out), *SETS)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / "r"
    shutil.copytree(run, dst)
    return dst


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "rounds.jsonl", "config.toml"])
def test_a_planted_link_is_refused_and_its_target_untouched(finished: Path, tmp_path: Path, name: str) -> None:
    run = _copy(finished, tmp_path)
    for gone in ("summary.json", "model.pt"):  # unfinished, no checkpoint: a resume restarts and rewrites the logs
        (run / gone).unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (run / name).unlink(missing_ok=True)
    os.symlink(victim, run / name)
    done = _fedhv("run", "--resume", str(run))
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{run / name} is a symbolic link" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "precious\n"


def test_a_new_out_with_a_planted_lock_link_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "new"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, out / ".lock")
    done = _fedhv("run", "multimnist", "--method", "uniform", "--out", str(out), *SETS)
    assert done.returncode == 2 and "is a symbolic link" in done.stderr, done.stderr[-2000:]
    assert victim.read_text() == "precious\n"
