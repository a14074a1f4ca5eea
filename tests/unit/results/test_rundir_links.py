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


@pytest.mark.needs_data
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


# ----------------------------------------------------------------- the derived-data cache and grids


def test_a_cache_entry_that_is_a_link_is_never_read_and_is_replaced_not_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link planted as a cache entry (to a valid ``.npz`` elsewhere) is not served; the rebuilt entry
    replaces the link itself and the target keeps its bytes. The same for a JSON record of the cache."""
    import numpy as np

    from fedhv.data.cache import fetch_arrays, read_json

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("FEDHV_CACHE", str(cache))
    victim = tmp_path / "victim.npz"
    np.savez(victim, a=np.full(3, 7.0))
    before = victim.read_bytes()
    (cache / "toy-k1.npz").symlink_to(victim)
    with pytest.warns(UserWarning, match=r"toy-k1\.npz is a symbolic link; fedhv never follows links in its cache"):
        arrays, info = fetch_arrays("toy", "k1", lambda: {"a": np.zeros(3)})
    assert info["status"] == "built" and np.array_equal(arrays["a"], np.zeros(3))  # the link's arrays not served
    assert not (cache / "toy-k1.npz").is_symlink() and victim.read_bytes() == before
    (cache / "record.json").symlink_to(tmp_path / "other.json")
    (tmp_path / "other.json").write_text('{"file": "x"}')
    with pytest.warns(UserWarning, match="record.json is a symbolic link"):
        assert read_json(cache / "record.json") is None


def test_a_cache_record_naming_another_path_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the sources missing, the cache's record names the entry that stands in for them; a record
    edited to name a path outside the cache (or another data set's entry) is not loaded, while a
    record naming its own entry is (the control)."""
    import json

    import numpy as np

    from fedhv.data.cache import cache_key
    from fedhv.data.derived import load_derived

    cache, empty = tmp_path / "cache", tmp_path / "no-sources"
    cache.mkdir()
    empty.mkdir()
    monkeypatch.setenv("FEDHV_CACHE", str(cache))
    outside = tmp_path / "outside.npz"
    np.savez(outside, a=np.ones(2))
    np.savez(cache / "other-k.npz", a=np.ones(2))
    np.savez(cache / "toy-own.npz", a=np.full(2, 5.0))
    record = cache / f"toy-{cache_key(x=1)}.sources.json"

    def build() -> dict:
        raise FileNotFoundError("sources missing (the build ran)")

    for file in (str(outside), "../outside.npz", "other-k.npz"):
        record.write_text(json.dumps({"file": file, "fingerprints": {"MNIST": "f"}, "root": "r", "warnings": []}))
        with pytest.raises(FileNotFoundError, match="the build ran"):
            load_derived("toy", ("MNIST",), {"x": 1}, empty, build)
    record.write_text(json.dumps({"file": "toy-own.npz", "fingerprints": {"MNIST": "f"}, "root": "r", "warnings": []}))
    arrays, prov = load_derived("toy", ("MNIST",), {"x": 1}, empty, build)
    assert np.array_equal(arrays["a"], np.full(2, 5.0)) and prov["cache"]["status"] == "loaded; sources missing"


def _grid_cmd(settings: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "fedhv.cli", "grid", str(settings), "--methods", "fedhv", "--seeds", "0",
            "--out", str(out), "--quiet"]


TINY = ("rounds = 2\n[partition]\nclients = 4\nsamples_per_client = 40\n[train]\nclients_per_round = 2\n"
        "batch_size = 8\nlocal_steps = 2\nlr_global = 1.0\nlr_local = 0.1\n[calibration]\nrounds = 1\n[eval]\ntest_period = 1\n"
        '[data]\nbenchmark = "grid_kill_benchmark:tiny"\n')


@pytest.mark.deploy
def test_grid_folders_calibrations_and_logs_are_never_followed(tmp_path: Path) -> None:
    """A grid received from others: a run folder or a calibration that is a link is refused before
    anything runs (one line naming it), and a ``run.log`` link is refused by the job instead of being
    appended to; the links' targets keep their bytes."""
    setting = tmp_path / "t.toml"
    setting.write_text(TINY)
    out = tmp_path / "grid"
    done = subprocess.run(_grid_cmd(setting, out), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    run, cal = out / "t" / "fedhv" / "s0", next((out / "calibration").glob("*.json"))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")

    def refused(path: Path) -> str:
        res = subprocess.run(_grid_cmd(setting, out), capture_output=True, text=True, timeout=300, check=False)
        assert res.returncode == 2, res.stdout + res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith("error: ") and f"{path} is a symbolic link" in line, res.stderr
        return line

    import shutil

    shutil.move(str(run), str(victim / "s0"))
    run.symlink_to(victim / "s0", target_is_directory=True)
    refused(run)
    run.unlink()
    shutil.move(str(victim / "s0"), str(run))
    shutil.move(str(cal), str(victim / "cal.json"))
    cal.symlink_to(victim / "cal.json")
    refused(cal)
    cal.unlink()
    shutil.move(str(victim / "cal.json"), str(cal))
    (run / "summary.json").unlink()  # the job runs again (resumes): its run.log is a link now
    (run / "run.log").unlink()
    (run / "run.log").symlink_to(victim / "keep.txt")
    res = subprocess.run(_grid_cmd(setting, out), capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 1 and "run.log is a symbolic link" in res.stderr, res.stdout + res.stderr
    assert (victim / "keep.txt").read_text() == "mine"
