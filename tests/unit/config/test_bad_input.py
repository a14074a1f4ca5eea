"""Bad input is rejected before any work starts, with the parameter, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhv.cli import main

from conftest import SMALL


def _sets(*extra: str) -> list[str]:
    return [a for o in [*SMALL, *extra] for a in ("--set", o)]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["partition.alpha=0"], "partition.alpha = 0.0 must be > 0; the Dirichlet concentration must be positive"),
        (["partition.alpha=-1"], "partition.alpha = -1.0 must be > 0"),
        (["train.clients_per_round=7"], "train.clients_per_round = 7 must be between 1 and partition.clients = 6"),
        (["train.local_steps=0"], "train.local_steps = 0 must be >= 1"),
        (["train.lr_local=-0.1"], "train.lr_local = -0.1 must be > 0"),
        (["lr.fedhv.global=-1"], "lr.fedhv.global = -1.0 must be > 0"),
        (["train.batch_size=100"], "train.batch_size = 100 exceeds partition.samples_per_client = 64"),
        (["faults.client_dropout=1.5"], "faults.client_dropout = 1.5 must be a probability in [0, 1)"),
        (["faults.corrupt_reports=-0.1"], "faults.corrupt_reports = -0.1 must be a probability"),
        (["checkpoint.period=-2"], "checkpoint.period = -2 must be >= 0"),
        (["checkpoint.every=2"], "unknown config key 'checkpoint.every'"),
        (["train.local_step=5"], "did you mean 'train.local_steps'"),
        (["train.local_steps=\"ten\""], "train.local_steps = 'ten' has the wrong type; expected int"),
        (["fedhv.report_batches=\"some\""], "fedhv.report_batches = 'some': use \"all\" or a positive integer"),
        (["calibration.margin=nan"], "must be a finite number"),
        (["engine=\"gpu\""], "engine = 'gpu' is not supported; choose one of batched, sequential"),
        # checked against the data set's size: these two read the data
        pytest.param(["partition.samples_per_client=200000"], "partition.samples_per_client = 200000 exceeds the",
                     marks=pytest.mark.needs_data),
        pytest.param(["partition.clients=100000", "partition.samples_per_client=1", "train.batch_size=1"],
                     "partition.clients = 100000 exceeds the", marks=pytest.mark.needs_data),
    ],
)
def test_bad_settings_are_rejected_before_any_work(overrides: list[str], expected: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    status = main(["run", "multimnist", "--rounds", "1", "--quiet", "--out", str(out), *_sets(*overrides)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert expected in err
    assert not out.exists()


def test_unknown_setting_suggests_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "multimnst", "--quiet"]) == 2
    assert "did you mean 'multimnist'" in capsys.readouterr().err


def test_run_without_setting_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--quiet"]) == 2
    assert "give a SETTING" in capsys.readouterr().err
