"""Checkpoints and calibrations are not trusted blindly.

A checkpoint is loaded as plain data (no code runs), carries a digest of its content,
and its fields are range-checked against the run's configuration; ``calibration.json``
carries a digest too; a failed checkpoint write is a one-line error that keeps the
previous checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.algorithms.fedcmoo import FedCMOOState
from fedhv.algorithms.fedhv import FedHVState
from fedhv.algorithms.fsmgda import FSMGDAState
from fedhv.algorithms.uniform import UniformState
from fedhv.cli import main
from fedhv.experiment import resume_experiment, run_experiment
from fedhv.experiment.accounting import RunTotals
from fedhv.experiment.calibration import CalibrationError, CalibrationResult, load_calibration
from fedhv.experiment.checkpoint import (
    CHECKPOINT_FILE,
    Checkpoint,
    ResumeError,
    global_rng_state,
    load_checkpoint,
    payload_digest,
    save_checkpoint,
)

from conftest import REPO
from helpers import small_config


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FedHV run (3 rounds, calibrated) interrupted in round 3: checkpoint at round 2."""
    from fedhv.experiment import loop

    original = loop.SimFederation.exchange

    def failing_exchange(self, theta, request):  # type: ignore[no-untyped-def]
        if self.round_idx == 2:
            raise _Stop
        return original(self, theta, request)

    run = tmp_path_factory.mktemp("partial") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop.SimFederation, "exchange", failing_exchange)
        with pytest.raises(_Stop):
            run_experiment(small_config('method="fedhv"', "rounds=3"), run, progress=False)
    ckpt = load_checkpoint(run)
    assert ckpt is not None and ckpt.round == 2
    return run


@pytest.fixture
def run(partial_run: Path, tmp_path: Path) -> Path:
    """A private copy of the interrupted run."""
    return Path(shutil.copytree(partial_run, tmp_path / "run"))


class _CreatesMarker:
    """Unpickling this object creates a file: what a crafted checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.needs_data
def test_checkpoint_with_code_is_refused_without_running_it(run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    torch.save({"format": 2, "round": 1, "x": _CreatesMarker(marker)}, run / CHECKPOINT_FILE)
    with pytest.raises(ResumeError) as refused:
        resume_experiment(run, progress=False)
    assert not marker.exists()
    assert re.search(r"checkpoint.pt holds more than plain data \(it references .*open\) and was not loaded",
                     str(refused.value))
    assert main(["run", "--resume", str(run), "--quiet"]) == 2  # the CLI: `error: ...`, exit 2
    err = capsys.readouterr().err
    assert "error:" in err and "holds more than plain data" in err and "Traceback" not in err
    assert not marker.exists()


def _same(a: Any, b: Any) -> bool:
    """Deep equality with tensors compared bit for bit (and numpy arrays elementwise)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and _same(vars(a), vars(b))
    if hasattr(a, "tobytes"):  # numpy arrays
        return hasattr(b, "tobytes") and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return bool(a == b) or (a != a and b != b)  # noqa: PLR0124 - NaN matches NaN


@pytest.mark.needs_data
def test_every_flipped_bit_is_detected_or_harmless(run: Path) -> None:
    """A bit flipped anywhere in checkpoint.pt: unreadable or digest mismatch, or no change at all."""
    path = run / CHECKPOINT_FILE
    original = path.read_bytes()
    reference = load_checkpoint(run)
    assert reference is not None
    theta_at = original.find(reference.theta.numpy().tobytes())
    assert theta_at > 0
    with zipfile.ZipFile(path) as archive:  # torch's format: a zip whose data.pkl holds all but tensor bytes
        pkl = next(i for i in archive.infolist() if i.filename.endswith("/data.pkl"))
    pkl_end = pkl.header_offset + 100 + len(pkl.filename) + pkl.file_size  # header, name, extra, content
    positions = sorted({*range(0, pkl_end, 3), *range(0, len(original), max(1, len(original) // 150)),
                        theta_at + 4 * 1000 + 2, len(original) - 30})
    silent, errors = [], []
    for pos in positions:
        data = bytearray(original)
        data[pos] ^= 1 << (pos % 8)
        path.write_bytes(bytes(data))
        try:
            loaded = load_checkpoint(run)
        except ResumeError as exc:
            errors.append(str(exc))
            continue
        if not _same(vars(loaded), vars(reference)):
            silent.append(pos)
    assert not silent, f"bits flipped at bytes {silent} changed the checkpoint silently"
    assert len(errors) > len(positions) // 2
    assert all("delete it to restart the run from round 0" in e for e in errors)
    # End to end: one flipped bit in theta stops the resume before anything changes.
    rounds_before = (run / "rounds.jsonl").read_bytes()
    data = bytearray(original)
    data[theta_at + 4 * 1000 + 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ResumeError, match=r"corrupted \(its digest does not match"):
        resume_experiment(run, progress=False)
    assert (run / "rounds.jsonl").read_bytes() == rounds_before


def _rewrite(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the raw payload of the run's checkpoint and store it with a valid digest."""
    path = run / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=True)
    change(payload)
    payload["digest"] = payload_digest(payload)
    torch.save(payload, path)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda p: p.__setitem__(key, value)


def _theta_nan(p: dict[str, Any]) -> None:
    p["theta"][7] = float("nan")


def _theta_short(p: dict[str, Any]) -> None:
    p["theta"] = p["theta"][:-1].clone()


def _three_weights(p: dict[str, Any]) -> None:
    p["state"]["data"]["weights"] = torch.full((3,), 1 / 3, dtype=torch.float64)
    p["state"]["data"]["last_report"] = None


def _weights_off_simplex(p: dict[str, Any]) -> None:
    p["state"]["data"]["weights"] = torch.tensor([0.9, 0.9], dtype=torch.float64)


def _other_kind(p: dict[str, Any]) -> None:
    p["state"] = {"kind": "uniform", "data": {"num_tasks": 2}}


@pytest.mark.needs_data
@pytest.mark.parametrize(("change", "message"), [
    (_set("round", 4), r"round = 4 is outside the configured rounds \[0, 3\]"),
    (_set("round", -1), r"round = -1 is invalid; expected an integer >= 0"),
    (_set("round", "2"), r"round = 2 is invalid; expected an integer >= 0"),
    (_theta_nan, r"theta = <1 non-finite values> is invalid"),
    (_theta_short, r"theta has \d+ values but the model has \d+ parameters"),
    (_three_weights, r"the algorithm state has 3 tasks but the run has 2"),
    (_weights_off_simplex, r"invalid algorithm state: fedhv weights \[0.9, 0.9\] are not on the simplex"),
    (_other_kind, r"the algorithm state is UniformState but the run's method uses FedHVState"),
    (_set("state", {"kind": "evil", "data": {}}), r"unknown algorithm state 'evil'"),
    (_set("offsets", {"rounds.jsonl": -5, "metrics.jsonl": 0}), r"offsets = .* is invalid"),
], ids=["round-beyond", "round-negative", "round-str", "theta-nan", "theta-length", "state-tasks",
        "state-simplex", "state-kind", "state-unknown", "offsets"])
def test_out_of_range_checkpoint_fields_are_rejected(run: Path, change: Callable[[dict[str, Any]], None],
                                                     message: str) -> None:
    _rewrite(run, change)
    before = {name: (run / name).read_bytes() for name in ("rounds.jsonl", "metrics.jsonl", CHECKPOINT_FILE)}
    with pytest.raises(ResumeError, match=message + r".*delete it to restart the run from round 0"):
        resume_experiment(run, progress=False)
    assert {name: (run / name).read_bytes() for name in before} == before  # nothing was repaired or resumed


@pytest.mark.needs_data
def test_edited_calibration_is_refused_on_resume_and_in_grids(run: Path) -> None:
    path = run / "calibration.json"
    stored = json.loads(path.read_text())
    assert isinstance(stored.get("digest"), str)
    assert load_calibration(path) == CalibrationResult.from_dict(stored)  # an intact file loads
    edited = {**stored, "reference": [stored["reference"][0] + 0.01, *stored["reference"][1:]]}
    path.write_text(json.dumps(edited, indent=2))
    with pytest.raises(CalibrationError, match=rf"{path} was modified after it was written .*delete {path}"):
        resume_experiment(run, progress=False)
    # The grid reads shared calibrations with CalibrationResult.from_dict: the same check.
    with pytest.raises(CalibrationError, match="was modified after it was written"):
        CalibrationResult.from_dict(edited)
    no_digest = {k: v for k, v in stored.items() if k != "digest"}
    with pytest.raises(CalibrationError, match="has no digest"):
        CalibrationResult.from_dict(no_digest)
    with pytest.raises(CalibrationError, match=r"has the fields .*'surprise'"):
        CalibrationResult.from_dict({**stored, "surprise": 1})


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from fedhv.algorithms.fedcmoo import FedCMOOState
from fedhv.algorithms.fedhv import FedHVState
from fedhv.algorithms.fsmgda import FSMGDAState
from fedhv.algorithms.uniform import UniformState
from fedhv.cli import main
from fedhv.experiment.accounting import RunTotals
sys.exit(main(["run", "--resume", sys.argv[1], "--quiet"]))
"""


@pytest.mark.needs_data
def test_failed_checkpoint_write_is_one_line_and_keeps_the_previous(run: Path) -> None:
    """A real resume process whose files may not exceed half a checkpoint (RLIMIT_FSIZE)."""
    ckpt = (run / CHECKPOINT_FILE).read_bytes()
    limit = len(ckpt) // 2
    assert limit > 20 * (run / "rounds.jsonl").stat().st_size  # the JSON-lines files still fit
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _LIMITED, str(run), str(limit)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: could not write checkpoint {run / CHECKPOINT_FILE}: [Errno 27] File too large; "
        f"raise the file size limit (ulimit -f) or free space and resume with `fedhv run --resume {run}`"
    )
    assert (run / CHECKPOINT_FILE).read_bytes() == ckpt  # the previous checkpoint, intact
    assert not [p.name for p in run.iterdir() if p.name.startswith(".checkpoint.pt.")]
    summary = resume_experiment(run, progress=False)  # with space again, the run completes
    assert summary["rounds"] == 3 and (run / "summary.json").exists()


@pytest.mark.parametrize("state", [
    FedHVState(np.array([0.25, 0.75]), np.array([1.5, 2.5])),
    FedHVState(np.array([0.5, 0.5])),
    FedCMOOState(np.array([0.2, 0.3, 0.5]), round=7),
    FSMGDAState(3, np.array([0.001, 0.499, 0.5])),
    FSMGDAState(2),
    UniformState(4),
], ids=["fedhv", "fedhv-initial", "fedcmoo", "fsmgda", "fsmgda-initial", "uniform"])
def test_every_algorithm_state_is_stored_as_plain_data_and_restored_exactly(state: Any, tmp_path: Path) -> None:
    np.random.seed(3)
    torch.manual_seed(3)
    ckpt = Checkpoint(5, torch.randn(10, dtype=torch.float64), state, dataclasses.asdict(RunTotals()),
                      {"round": 5, "mean_acc": np.float64(0.5)}, {"rounds.jsonl": 10, "metrics.jsonl": 0}, 1.25,
                      "abc", global_rng_state())
    save_checkpoint(tmp_path, ckpt)
    torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)  # plain data only
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and _same(vars(loaded.state), vars(state))
    assert _same(loaded.rng["torch"], ckpt.rng["torch"])
    assert _same(list(loaded.rng["numpy"]), list(ckpt.rng["numpy"]))
    assert loaded.theta.equal(ckpt.theta) and loaded.last_eval == {"round": 5, "mean_acc": 0.5}
