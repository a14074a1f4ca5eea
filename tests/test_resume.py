"""Checkpoints and exact resume: an interrupted run, resumed, equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhv.experiment import resume_experiment, run_experiment
from fedhv.experiment.checkpoint import ResumeError, load_checkpoint, truncate_jsonl
from fedhv.experiment.runner import PAUSE_ENV, PAUSE_FILE
from fedhv.results.rundir import read_jsonl

from conftest import REPO, SMALL
from helpers import small_config

#: Fields that measure time; everything else must be identical after a resume.
TIMING = ("wall_clock", "time_", "seconds")


def _strip_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_timing(v) for k, v in value.items() if not any(t in k for t in TIMING)}
    if isinstance(value, list):
        return [_strip_timing(v) for v in value]
    return value


def _outputs(run: Path) -> dict[str, Any]:
    return {
        "metrics": _strip_timing(read_jsonl(run / "metrics.jsonl")),
        "rounds": _strip_timing(read_jsonl(run / "rounds.jsonl")),
        "summary": _strip_timing(json.loads((run / "summary.json").read_text())),
    }


def _assert_same_run(a: Path, b: Path) -> None:
    out_a, out_b = _outputs(a), _outputs(b)
    assert out_a["metrics"] == out_b["metrics"]
    assert out_a["rounds"] == out_b["rounds"]
    assert out_a["summary"] == out_b["summary"]
    model_a = torch.load(a / "model.pt")["state_dict"]
    model_b = torch.load(b / "model.pt")["state_dict"]
    assert model_a.keys() == model_b.keys()
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), key


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    ("engine", "method", "extra"),
    [
        ("batched", "fedhv", ("eval.test_period=2",)),
        ("sequential", "fedhv", ("eval.test_period=2", "faults.client_dropout=0.3", "faults.corrupt_reports=0.2")),
        ("batched", "fedcmoo", ("eval.test_period=2",)),
    ],
)
def test_resume_equals_uninterrupted_run(engine: str, method: str, extra: tuple[str, ...], tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = small_config(f"engine=\"{engine}\"", f"method=\"{method}\"", "rounds=5", *extra)
    full = tmp_path / "full"
    run_experiment(cfg, full, progress=False)

    # Interrupt the second run inside round 4 (after the checkpoint of round 2 and the
    # records of round 3): the records of round 3 must be dropped and re-done.
    from fedhv.experiment import loop

    original = loop.SimFederation.exchange
    calls = {"n": 0}

    def failing_exchange(self, theta, request):  # type: ignore[no-untyped-def]
        if self.round_idx == 3:
            raise _Stop
        calls["n"] += 1
        return original(self, theta, request)

    monkeypatch.setattr(loop.SimFederation, "exchange", failing_exchange)
    part = tmp_path / "part"
    with pytest.raises(_Stop):
        run_experiment(cfg, part, progress=False)
    monkeypatch.setattr(loop.SimFederation, "exchange", original)
    ckpt = load_checkpoint(part)
    assert ckpt is not None and ckpt.round == 3  # the interrupted run saved its last finished round
    # Rounds 1-3 ran in full and round 4 was stopped at its first exchange: FedHV has one
    # synchronization stage per round, FedCMOO three (reports, sketches, training; paper B.6).
    assert calls["n"] == 3 * {"fedhv": 1, "fedcmoo": 3}[method]
    assert [r["round"] for r in read_jsonl(part / "rounds.jsonl")] == [1, 2, 3]
    assert [m["round"] for m in read_jsonl(part / "metrics.jsonl")] == [2]
    assert not (part / "summary.json").exists()
    # What a kill during writing leaves: a record of a round after the checkpoint and a torn line.
    with open(part / "rounds.jsonl", "ab") as fh:
        fh.write(b'{"round": 4, "clients": [0]}\n')
    with open(part / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"round": 4, "mean_a')
    resume_experiment(part, progress=False)
    _assert_same_run(full, part)


def test_truncate_jsonl_reports_torn_lines_and_later_records(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3}\n{"a": ')
    repair = truncate_jsonl(path, len(b'{"a": 1}\n'))
    assert repair.records_dropped == 2 and repair.torn_line
    assert path.read_bytes() == b'{"a": 1}\n'
    assert "torn" in repair.describe("m.jsonl")
    with pytest.raises(ResumeError, match="expects at least"):
        truncate_jsonl(path, 100)
    with pytest.raises(ResumeError, match="line end"):
        truncate_jsonl(path, 3)


def test_resume_rejects_changed_config_and_non_run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ResumeError, match="not a fedhv run directory"):
        resume_experiment(tmp_path, progress=False)
    from fedhv.experiment import loop

    original = loop.SimFederation.exchange

    def failing_exchange(self, theta, request):  # type: ignore[no-untyped-def]
        if self.round_idx == 1:
            raise _Stop
        return original(self, theta, request)

    monkeypatch.setattr(loop.SimFederation, "exchange", failing_exchange)
    cfg = small_config("method=\"uniform\"", "rounds=2")
    run = tmp_path / "run"
    with pytest.raises(_Stop):
        run_experiment(cfg, run, progress=False)
    monkeypatch.setattr(loop.SimFederation, "exchange", original)
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text(text.replace("rounds = 2", "rounds = 3"))
    with pytest.raises(ResumeError, match="changed after the checkpoint"):
        resume_experiment(run, progress=False)
    (run / "config.toml").write_text(text)
    resume_experiment(run, progress=False)
    assert (run / "summary.json").exists() and not (run / "checkpoint.pt").exists()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedhv.cli", *args]


def test_kill_9_then_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    """A real ``fedhv run`` process killed with SIGKILL mid-run, then ``fedhv run --resume``.

    Deterministic: the test-only hook ``FEDHV_TEST_PAUSE_AFTER_ROUND=5`` stops the run
    still after round 5 is recorded (checkpoint of round 4, round 5's lines after it), so
    the kill always lands between a checkpoint and a later record, on any machine.
    """
    sets = [a for o in [*SMALL, "eval.test_period=2"] for a in ("--set", o)]
    common = ["run", "multimnist", "--method", "fedhv", "--rounds", "8", "--quiet", *sets]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    full = tmp_path / "full"
    subprocess.run(_cli(*common, "--out", str(full)), check=True, env=env, capture_output=True, timeout=300)

    part = tmp_path / "part"
    proc = subprocess.Popen(_cli(*common, "--out", str(part)), env={**env, PAUSE_ENV: "5"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (part / PAUSE_FILE).exists():  # the run writes it, then sleeps until killed
            assert proc.poll() is None, "the run ended without pausing at round 5"
            assert time.monotonic() < deadline, "the run did not reach round 5 in 240 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (part / "summary.json").exists()
    assert (part / PAUSE_FILE).read_text() == "5"
    assert _checkpoint_round(part) == 4
    assert [r["round"] for r in read_jsonl(part / "rounds.jsonl")] == [1, 2, 3, 4, 5]
    assert [m["round"] for m in read_jsonl(part / "metrics.jsonl")] == [2, 4]
    done = subprocess.run(_cli("run", "--resume", str(part), "--quiet"), env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr and "at round 4 of 8" in done.stderr
    assert "rounds.jsonl: removed 1 record(s) written after the checkpoint" in done.stderr, done.stderr
    _assert_same_run(full, part)


def _checkpoint_round(run: Path) -> int:
    """Round of ``run``'s checkpoint (0 when it has none)."""
    ckpt = load_checkpoint(run)
    return 0 if ckpt is None else ckpt.round


def test_resume_cli_rejects_extra_arguments(tmp_path: Path) -> None:
    from fedhv.cli import main

    assert main(["run", "multimnist", "--resume", str(tmp_path)]) == 2
    assert main(["run", "--resume", str(tmp_path)]) == 2
