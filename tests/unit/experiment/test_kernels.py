"""Float kernels in the run's provenance: what decides the float bits besides code, seed and threads.

The README run moved from 90.81 / 88.79 to 91.18 / 89.40 between two sessions with bit-identical
code paths (checked by running both commits on one machine); the instruction set the CPU kernels
used differed. A run therefore records its kernels, and a resume on other kernels says that it
will not equal an uninterrupted run bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedhv.experiment import resume_experiment, run_experiment
from fedhv.experiment.environment import KERNEL_ENV, kernel_fingerprint
from repo.test_claims import _interrupt_at, _Stop

from helpers import small_config


@pytest.mark.needs_data
def test_environment_records_the_cpu_kernels(tmp_path: Path) -> None:
    run_experiment(small_config("rounds=1"), tmp_path / "r", progress=False)
    kernels = json.loads((tmp_path / "r" / "environment.json").read_text())["kernels"]
    assert kernels["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert kernels["mkl"] == torch.backends.mkl.is_available()
    assert kernels["env"] == {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}


def test_kernel_selecting_variables_are_recorded() -> None:
    """A process started with ``ATEN_CPU_CAPABILITY=default`` runs (and records) the scalar kernels."""
    code = "import json; from fedhv.experiment.environment import kernel_fingerprint as k; print(json.dumps(k()))"
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                         capture_output=True, text=True, check=True)
    other = json.loads(res.stdout)
    assert other["cpu_capability"] == "DEFAULT" and other["env"] == {"ATEN_CPU_CAPABILITY": "default"}
    assert other != kernel_fingerprint()


@pytest.mark.needs_data
def test_resume_on_other_kernels_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    cfg = small_config("rounds=3", "eval.test_period=1")
    part = tmp_path / "part"
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(_Stop):
        run_experiment(cfg, part, progress=False)
    monkeypatch.undo()
    env_file = part / "environment.json"
    env = json.loads(env_file.read_text())
    env["kernels"] = {**env["kernels"], "cpu_capability": "AVX2-elsewhere"}  # as if started on another CPU
    env_file.write_text(json.dumps(env))
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        resume_experiment(part, progress=False)
    assert "float kernels" in caplog.text and "AVX2-elsewhere" in caplog.text
    resumes = [json.loads(line) for line in (part / "resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["kernels"] == kernel_fingerprint()
    caplog.clear()
    # the same kernels: no warning
    part2 = tmp_path / "part2"
    _interrupt_at(monkeypatch, 2)
    with pytest.raises(_Stop):
        run_experiment(cfg, part2, progress=False)
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        resume_experiment(part2, progress=False)
    assert "float kernels" not in caplog.text
