"""Issue 28, items 7 and 8: seeds of the Python API in [0, 2**32 - 1]; a CLI user benchmark with a label
outside its task's classes is one ``error:`` line, exit 2, nothing left behind.

Both fail on the code before this stop: ``simulate(seed=2**32)`` trained the model of seed 0 and
``from_tensors(seed=-1)`` was accepted; the bad label gave a traceback, exit 1 and an unfinished run
directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fedhv


def _data(**kw) -> fedhv.FederatedDataset:
    x = torch.randn(80, 4, generator=torch.Generator().manual_seed(0))
    return fedhv.FederatedDataset.from_tensors(x, [(x[:, 0] > 0).long()], ["a"], clients=4, **kw)


@pytest.mark.parametrize("seed", [2**32, 5 + 2**32, -1])
def test_api_seeds_out_of_range_are_refused(seed: int) -> None:
    with pytest.raises(fedhv.ConfigError, match=r"seed = .* is out of range; seeds must be integers in \[0, 2\*\*32"):
        _data(seed=seed)
    with pytest.raises(fedhv.ConfigError, match=r"seed = .* is out of range"):
        fedhv.simulate(nn.Linear(4, 2), _data(), fedhv.Uniform(), rounds=1, seed=seed, progress=False)
    with pytest.raises(fedhv.ConfigError, match=r"calibration.seeds\[0\] = .* is out of range"):
        fedhv.calibrate(nn.Linear(4, 2), _data(), rounds=1, seeds=(seed,))


def test_cli_user_benchmark_with_a_bad_label_is_one_error_line_and_leaves_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('setting = "bad"\nrounds = 2\n[data]\nbenchmark = "bad_label_benchmark:make_benchmark"\n'
                   "[partition]\nclients = 4\nsamples_per_client = 40\n[train]\nclients_per_round = 2\n"
                   "batch_size = 8\n[lr.uniform]\nglobal = 1.0\nlocal = 0.1\n")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", str(cfg), "--method", "uniform", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert errors[-1].startswith("error: ") and "task 'a' has label 7 (row 17) outside [0, 2)" in errors[-1]
    assert "Traceback" not in done.stderr
    assert not out.exists() or not any(p.name != ".lock" for p in out.iterdir())


@pytest.mark.deploy
@pytest.mark.needs_data
def test_a_resume_caps_the_recorded_thread_count_at_the_machines_cores(tmp_path: Path) -> None:
    """Issue 28 (smaller ones): an edited ``environment.json`` asking for 300 threads spawned 601 threads on
    2 cores; a resume now uses at most the machine's cores, with one warning."""
    import json
    import os

    from conftest import SMALL

    out = tmp_path / "run"
    sets = [a for o in [*SMALL, "rounds=2", "calibration.rounds=1"] for a in ("--set", o)]
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "multimnist", "--method", "uniform", "--out",
                           str(out), *sets], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    env = json.loads((out / "environment.json").read_text())
    env["torch_threads"] = 300
    (out / "environment.json").write_text(json.dumps(env))
    for name in ("summary.json", "model.pt"):
        (out / name).unlink()
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "--resume", str(out)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    cores = os.cpu_count() or 1
    assert f"records 300 torch threads but this machine has {cores} cores" in done.stderr
    assert json.loads((out / "resumes.jsonl").read_text().splitlines()[-1])["torch_threads"] <= cores
