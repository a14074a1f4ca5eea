"""Run directories: exclusive, never silently mixed, strict JSON, one file mode, SIGTERM, disk errors.

Real ``fedhv`` processes for everything that is about processes (locks held by another
process, SIGTERM, the umask, a file size limit); ``fedhv.cli.main`` in-process for
refusals that happen before any work.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhv.cli import main
from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.experiment import resume_experiment, run_experiment
from fedhv.experiment.checkpoint import ResumeError, load_checkpoint
from fedhv.results.rundir import JsonlWriter, RunDir, RunDirBusy, read_jsonl, write_json

from conftest import REPO, SMALL
from helpers import small_config

ROUNDS = 2
LONG_ROUNDS = 24
LONG = [*SMALL, "eval.test_period=2", "partition.samples_per_client=96"]


def _sets(*items: str) -> list[str]:
    return [a for o in items for a in ("--set", o)]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", **extra}


def _fedhv(*args: str, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env=kwargs.pop("env", _env()), **kwargs)


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A finished FedHV run made by a real ``fedhv run`` under umask 027."""
    out = tmp_path_factory.mktemp("finished") / "run"
    proc = _fedhv("run", "multimnist", "--rounds", str(ROUNDS), "--quiet", "--out", str(out), *_sets(*SMALL),
                  preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def terminated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A real ``fedhv run`` stopped with SIGTERM after a checkpoint and at least one later round."""
    out = tmp_path_factory.mktemp("terminated") / "run"
    # Checkpoints every 6 rounds (with each test evaluation): SIGTERM comes 1-3 rounds after one,
    # so the next periodic checkpoint cannot land between the check and the signal (rounds of
    # this small run take a few tens of ms).
    proc = subprocess.Popen([sys.executable, "-m", "fedhv.cli", "run", "multimnist", "--rounds", str(LONG_ROUNDS), "--quiet",
                             "--out", str(out), *_sets(*LONG, "eval.test_period=6")], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            ckpt = _checkpoint_round(out)
            if ckpt and ckpt < len(read_jsonl(out / "rounds.jsonl")) <= ckpt + 3:
                break
            if proc.poll() is not None:
                pytest.fail("the run finished before SIGTERM; make it longer")
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _checkpoint_round(run: Path) -> int:
    try:
        ckpt = load_checkpoint(run)
    except ResumeError:  # being replaced right now
        return 0
    return 0 if ckpt is None else ckpt.round


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- item 1: never mix two runs


@pytest.mark.needs_data
def test_out_holding_a_finished_run_is_refused_and_overwrite_replaces_it(
        finished: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(finished[0], tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    args = ["run", "multimnist", "--method", "uniform", "--rounds", str(ROUNDS), "--quiet", "--out", str(run),
            *_sets(*SMALL)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--out {run} already holds a finished run" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before

    assert main([*args, "--overwrite"]) == 0
    assert [m["round"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(1, ROUNDS + 1))  # uniform's only
    assert not (run / "calibration.json").exists()  # FedHV's calibration went with its run
    assert json.loads((run / "summary.json").read_text())["method"] == "uniform"


@pytest.mark.needs_data
def test_out_holding_an_unfinished_run_is_refused_even_with_overwrite(
        finished: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(finished[0], tmp_path / "run")
    (run / "summary.json").unlink()
    (run / "model.pt").unlink()
    config = (run / "config.toml").read_bytes()
    args = ["run", "multimnist", "--method", "uniform", "--rounds", "1", "--quiet", "--out", str(run),
            *_sets(*SMALL)]
    assert main(args) == 2
    assert "already holds an unfinished run" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 2
    assert "--overwrite replaces only finished runs" in capsys.readouterr().err
    assert (run / "config.toml").read_bytes() == config and not (run / "summary.json").exists()


@pytest.mark.needs_data
def test_second_writer_fails_at_once_while_another_process_holds_the_run(
        finished: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(finished[0], tmp_path / "run")
    (run / "summary.json").unlink()  # an interrupted run: a --resume would truncate and retrain it
    (run / "model.pt").unlink()
    holder = RunDir(run)  # the lock a live `fedhv run` / `--resume` / grid worker holds
    try:
        rounds = (run / "rounds.jsonl").read_bytes()
        with pytest.raises(RunDirBusy, match="in use by another fedhv process"):
            RunDir(run)
        busy = f"run directory {run} is in use by another fedhv process (pid {os.getpid()}"
        proc = _fedhv("run", "--resume", str(run), "--quiet", timeout=120)  # another process
        assert proc.returncode == 2, proc.stderr
        assert busy in proc.stderr and "resuming" not in proc.stderr and "Traceback" not in proc.stderr
        assert main(["run", "multimnist", "--rounds", "1", "--quiet", "--out", str(run), *_sets(*SMALL)]) == 2
        assert busy in capsys.readouterr().err
        assert (run / "rounds.jsonl").read_bytes() == rounds  # the resume did not truncate anything
    finally:
        holder.close()
    resume_experiment(run, progress=False)  # released: the run can be continued
    assert (run / "summary.json").exists()


def test_default_run_directories_never_collide(tmp_path: Path) -> None:
    runs = [RunDir.create_default("multimnist", "fedhv", 0, base=tmp_path) for _ in range(3)]
    try:
        names = [r.path.name for r in runs]
        assert len(set(names)) == 3, names  # same second: -2, -3 suffixes
        assert all(n.startswith("multimnist-fedhv-s0-") and r.path.is_dir() for n, r in zip(names, runs))
    finally:
        for r in runs:
            r.close()


@pytest.mark.parametrize(
    ("out", "extra", "expected"),
    [
        ("", [], "--out '' is empty"),
        ("file", [], "is a file, not a directory"),
        ("file/sub", [], "Not a directory (ENOTDIR)"),
        (None, ["setting=\"../escaped\""], "setting = '../escaped' names run directories"),
    ],
)
def test_unusable_out_is_refused_before_loading_data(out: str | None, extra: list[str], expected: str,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # No data and an empty cache: a check that came after data loading would report missing MNIST instead.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDHV_CACHE", str(tmp_path / "cache"))
    (tmp_path / "file").write_text("not a directory")
    args = ["run", "multimnist", "--rounds", "1", "--quiet", "--data-dir", str(tmp_path / "no-data"),
            *_sets(*SMALL, "data.download=false", *extra)]
    if out is not None:
        args += ["--out", out]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(args) == 2
    err = capsys.readouterr().err
    assert expected in err and "MNIST" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created (no runs/, no stray files)


@pytest.mark.needs_data
def test_all_run_files_get_the_umask_mode(finished: tuple[Path, Any]) -> None:
    run = finished[0]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.iterdir() if p.is_file()}
    assert {"config.toml", "summary.json", "calibration.json", "rounds.jsonl", "model.pt"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o640)  # 0o666 & ~0o027, atomic writes included


@pytest.mark.needs_data
def test_run_prints_its_directory_at_start_and_end(finished: tuple[Path, Any]) -> None:
    run, proc = finished
    lines = proc.stdout.splitlines()
    assert lines[0] == f"run directory: {run}" and lines[-1] == f"run directory: {run}", proc.stdout


# --------------------------------------------------------------------------- item 11: strict JSON


@pytest.mark.needs_data
def test_run_files_are_strict_json_with_null_for_non_finite_values(
        finished: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(finished[0], tmp_path / "grid" / "run")
    (run / ".lock").unlink(missing_ok=True)
    nan, inf = float("nan"), float("inf")
    summary = json.loads((run / "summary.json").read_text())
    summary.update(mean_acc=nan, worst_acc=nan, hv=-inf, task_acc=[nan, 50.0], min_report_slack=inf,
                   end_to_end={**summary["end_to_end"], "wall_clock_s": nan})
    write_json(run / "summary.json", summary)
    text = (run / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    parsed = _strict(text)
    assert parsed["mean_acc"] is None and parsed["hv"] is None and parsed["task_acc"] == [None, 50.0]
    assert parsed["end_to_end"]["wall_clock_s"] is None and parsed["min_report_slack"] is None
    writer = JsonlWriter(run / "metrics.jsonl")
    writer.append({"round": 99, "mean_acc": nan, "task_loss": (inf, 1.5), "nested": {"x": [-inf]}})
    writer.close()
    last = _strict((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last == {"round": 99, "mean_acc": None, "task_loss": [None, 1.5], "nested": {"x": [None]}}
    # Readers accept null where a number was.
    assert main(["table", str(tmp_path / "grid"), "--table", "1,8,9,11,7,13"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------- item 12: early checks, SIGTERM, disk errors


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["eval.splits=['val']"], "eval.splits = ['val'] has no \"test\""),
        (["eval.test_period=0", "eval.final=false"], "eval.test_period = 0 with eval.final = false"),
        (["rounds=4", "eval.test_period=5", "eval.final=false"], "eval.test_period = 5 with eval.final = false"),
    ],
)
def test_a_run_that_never_evaluates_the_test_set_is_refused(overrides: list[str], expected: str) -> None:
    with pytest.raises(ConfigError, match="never evaluate|has no"):
        load_config("multimnist", overrides)
    try:
        load_config("multimnist", overrides)
    except ConfigError as exc:
        assert expected in str(exc)
    load_config("multimnist", ["eval.test_period=0", "eval.final=true", "eval.splits=['test', 'val']"])


def test_summary_line_tolerates_missing_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    from fedhv.cli import _print_summary

    _print_summary({"method": "uniform", "seed": 0, "mean_acc": None, "worst_acc": None, "mean_loss": None,
                    "hv": None, "task_acc": None, "wall_clock_s": 1.5})
    assert capsys.readouterr().out.strip() == (
        "uniform seed 0: MeanAcc n/a  WorstAcc n/a  MeanLoss n/a  HV n/a  task acc n/a  (1.5 s)"
    )


@pytest.mark.needs_data
def test_sigterm_checkpoints_the_last_round_then_resume_completes(terminated: tuple[Path, Any],
                                                                   tmp_path: Path) -> None:
    src, proc = terminated
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "Traceback" not in proc.stderr and "terminated (signal 15)" in proc.stderr
    written = len(read_jsonl(src / "rounds.jsonl"))
    ckpt = load_checkpoint(src)
    assert ckpt is not None and ckpt.round == written  # every finished round was checkpointed
    assert f"checkpoint written at round {written}" in proc.stderr
    run = _copy(src, tmp_path / "run")
    done = _fedhv("run", "--resume", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    assert [r["round"] for r in read_jsonl(run / "rounds.jsonl")] == list(range(1, LONG_ROUNDS + 1))


@pytest.mark.needs_data
def test_disk_error_while_writing_is_one_line_and_keeps_the_checkpoint(terminated: tuple[Path, Any],
                                                                       tmp_path: Path) -> None:
    run = _copy(terminated[0], tmp_path / "run")
    ckpt_bytes = (run / "checkpoint.pt").read_bytes()
    ckpt = load_checkpoint(run)
    assert ckpt is not None
    # A file size limit a little above the JSON-lines files' checkpointed lengths: the first
    # records of the resumed rounds hit EFBIG, as on a full disk (Python ignores SIGXFSZ).
    limit = max(ckpt.offsets.values()) + 200

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _fedhv("run", "--resume", str(run), "--quiet", preexec_fn=limit_files)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and ".jsonl: File too large (EFBIG)" in errors[0], proc.stderr
    assert (run / "checkpoint.pt").read_bytes() == ckpt_bytes  # the previous checkpoint is kept
    resume_experiment(run, progress=False)  # and the run continues from it once there is room
    assert [r["round"] for r in read_jsonl(run / "rounds.jsonl")] == list(range(1, LONG_ROUNDS + 1))


# --------------------------------------------------------------------------- item 6: thread count


@pytest.mark.needs_data
def test_resume_uses_the_thread_count_the_run_recorded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = torch.get_num_threads()
    run = tmp_path / "run"
    try:
        torch.set_num_threads(1)  # as a grid worker with --threads 1 does
        run_experiment(small_config("method=\"uniform\"", "rounds=1"), run, progress=False)
        assert json.loads((run / "environment.json").read_text())["torch_threads"] == 1
        (run / "summary.json").unlink()  # interrupted before its first checkpoint: resumes at round 0
        torch.set_num_threads(2)
        logger = logging.getLogger("fedhv")
        logger.addHandler(caplog.handler)
        try:
            with caplog.at_level(logging.WARNING, logger="fedhv"):
                resume_experiment(run, progress=False)
        finally:
            logger.removeHandler(caplog.handler)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert read_jsonl(run / "resumes.jsonl")[-1]["torch_threads"] == 1
    assert "using 1 torch threads as recorded in environment.json (not 2)" in caplog.text
