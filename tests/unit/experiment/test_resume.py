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
from fedhv.experiment.kill_point import PAUSE_ENV, PAUSE_FILE
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


@pytest.mark.needs_data
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
    calls: list[int] = []  # round index of every exchange that went through

    def failing_exchange(self, theta, request):  # type: ignore[no-untyped-def]
        if self.round_idx == 3:
            raise _Stop
        calls.append(self.round_idx)
        return original(self, theta, request)

    monkeypatch.setattr(loop.SimFederation, "exchange", failing_exchange)
    part = tmp_path / "part"
    with pytest.raises(_Stop):
        run_experiment(cfg, part, progress=False)
    monkeypatch.setattr(loop.SimFederation, "exchange", original)
    ckpt = load_checkpoint(part)
    assert ckpt is not None and ckpt.round == 3  # the interrupted run saved its last finished round
    # FedHV's 2 one-exchange calibration rounds, then rounds 1-3 in full (FedHV: one client
    # exchange per round; FedCMOO: two, gradient sketches then training, with the sketch
    # relay as its third stage); round 4 was stopped at its first exchange.
    exchanges = {"fedhv": 1, "fedcmoo": 2}[method]
    calibration = [0, 1] if method == "fedhv" else []
    assert calls == calibration + [t for t in range(3) for _ in range(exchanges)]
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


@pytest.mark.needs_data
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


KILL_SETS = [a for o in [*SMALL, "eval.test_period=2"] for a in ("--set", o)]
KILL_RUN = ["run", "multimnist", "--method", "fedhv", "--rounds", "8", "--quiet", *KILL_SETS]


def _kill_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def uninterrupted_cli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted ``fedhv run`` that the killed-and-resumed runs must equal."""
    full = tmp_path_factory.mktemp("kill") / "full"
    subprocess.run(_cli(*KILL_RUN, "--out", str(full)), check=True, env=_kill_env(), capture_output=True, timeout=300)
    return full


@pytest.mark.deploy
@pytest.mark.needs_data
@pytest.mark.parametrize(("pause", "checkpoint", "evaluated"), [(5, 4, [2, 4]), (1, 0, [])])
def test_kill_9_then_resume_matches_uninterrupted_run(pause: int, checkpoint: int, evaluated: list[int],
                                                      uninterrupted_cli_run: Path, tmp_path: Path) -> None:
    """A real ``fedhv run`` process killed with SIGKILL mid-run, then ``fedhv run --resume``.

    Deterministic: the test-only hook ``FEDHV_TEST_PAUSE_AFTER_ROUND=<pause>`` stops the run
    still once round ``pause`` is recorded, so the kill lands at a known point on any
    machine: after round 5 (checkpoint of round 4, round 5's line after it), or after
    round 1, before the first checkpoint (the resume restarts at round 0 and reuses the
    run's calibration.json).
    """
    part = tmp_path / "part"
    proc = subprocess.Popen(_cli(*KILL_RUN, "--out", str(part)), env={**_kill_env(), PAUSE_ENV: str(pause)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (part / PAUSE_FILE).exists():  # the run writes it, then sleeps until killed
            assert proc.poll() is None, f"the run ended without pausing at round {pause}"
            assert time.monotonic() < deadline, f"the run did not reach round {pause} in 240 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (part / "summary.json").exists()
    assert (part / PAUSE_FILE).read_text() == str(pause)
    assert _checkpoint_round(part) == checkpoint
    assert [r["round"] for r in read_jsonl(part / "rounds.jsonl")] == list(range(1, pause + 1))
    assert [m["round"] for m in read_jsonl(part / "metrics.jsonl")] == evaluated
    calibration = (part / "calibration.json").read_bytes()
    done = subprocess.run(_cli("run", "--resume", str(part), "--quiet"), env=_kill_env(), capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resuming {part} at round {checkpoint} of 8" in done.stderr, done.stderr
    assert "rounds.jsonl: removed 1 record(s) written after the checkpoint" in done.stderr, done.stderr
    assert (part / "calibration.json").read_bytes() == calibration
    # Reused, not calibrated again: the summary's calibration cost is the stored one, to the bit.
    summary = json.loads((part / "summary.json").read_text())
    assert summary["calibration"]["seconds"] == json.loads(calibration)["seconds"]
    _assert_same_run(uninterrupted_cli_run, part)


def _checkpoint_round(run: Path) -> int:
    """Round of ``run``'s checkpoint (0 when it has none)."""
    ckpt = load_checkpoint(run)
    return 0 if ckpt is None else ckpt.round


@pytest.mark.needs_data
def test_resume_cli_rejects_extra_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--resume`` with a SETTING or an option that would change the run is refused before the
    directory is touched; the same, genuinely resumable directory resumes without them.

    The directory is that of a real ``fedhv run`` process killed after round 1 (paused by the
    test-only hook), so the extra argument is the only possible cause of the refusal.
    """
    from fedhv.cli import main

    run = tmp_path / "run"
    sets = [a for o in SMALL for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", PAUSE_ENV: "1"}
    proc = subprocess.Popen(_cli("run", "multimnist", "--method", "uniform", "--rounds", "3", "--quiet", *sets,
                                 "--out", str(run)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (run / PAUSE_FILE).exists():
            assert proc.poll() is None, "the run ended without pausing at round 1"
            assert time.monotonic() < deadline, "the run did not reach round 1 in 240 s"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert _checkpoint_round(run) == 1 and not (run / "summary.json").exists()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    for extra, flag in [(["multimnist"], "SETTING"), (["--set", "rounds=3"], "--set"), (["--rounds", "3"], "--rounds"),
                        (["--method", "uniform"], "--method"), (["--seed", "0"], "--seed")]:
        assert main(["run", *extra, "--resume", str(run), "--quiet"]) == 2, flag
        err = capsys.readouterr().err
        assert err.startswith("error: --resume continues a run") and f"drop {flag}" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # untouched
    assert main(["run", "--resume", str(run), "--quiet"]) == 0
    assert "resuming" in capsys.readouterr().err
    assert [r["round"] for r in read_jsonl(run / "rounds.jsonl")] == [1, 2, 3]
    assert (run / "summary.json").exists() and not (run / "checkpoint.pt").exists()
