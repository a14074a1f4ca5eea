"""Divergence and poisoned updates: a blown-up run stops with a clear error; update norms can be bounded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhv.algorithms.base import Request
from fedhv.algorithms.validation import ClientReply, ReplySpec, norm_outliers, reply_problem
from fedhv.errors import ConfigError
from fedhv.experiment import run_experiment
from fedhv.experiment.calibration import CalibrationResult
from fedhv.experiment.checkpoint import load_checkpoint
from fedhv.experiment.divergence import DivergenceError
from fedhv.experiment.method_setup import resolve_reference
from fedhv.experiment.runner import RunHooks, resume_experiment
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import get_flat
from fedhv.results.rundir import read_jsonl
from fedhv.sim.faults import FaultInjector
from fedhv.sim.federation import SimFederation

from conftest import SMALL
from helpers import cli, small_config, small_data


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    sets = [x for s in SMALL for x in ("--set", s)]
    return cli("run", "multimnist", *sets, *args, "--quiet")


@pytest.mark.needs_data
@pytest.mark.parametrize(("override", "says"), [
    ("train.lr_local=50", "the global model's norm grew from"),   # huge but finite updates
    ("train.lr_global=1e39", "the global model has non-finite values"),  # theta overflows float32
])
def test_diverging_run_exits_2_naming_the_round_and_the_learning_rates(tmp_path: Path, override: str,
                                                                       says: str) -> None:
    """Today: exit 0 with a wrecked model and NaN / 1e19 metrics."""
    proc = _cli("--method", "uniform", "--set", override, "--rounds", "3", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and error[0].startswith("error: round 1: ") and says in error[0], proc.stderr
    lr_local, lr_global = ("50", "1") if "lr_local" in override else ("0.3", "1e+39")
    assert f"train.lr_local={lr_local} or train.lr_global={lr_global}" in error[0]
    assert read_jsonl(tmp_path / "run" / "rounds.jsonl") == []  # the diverged round is not recorded


@pytest.mark.needs_data
def test_poisoned_update_stops_the_run_and_the_checkpoint_is_the_last_good_round(tmp_path: Path) -> None:
    """One client's update x 1e30 passes the finiteness checks; the exploded model must not be kept."""
    cfg = small_config("method=\"uniform\"", "rounds=8", "checkpoint.period=1", "faults.poison_updates=0.1")
    with pytest.raises(DivergenceError, match=r"^round 3: the global model's norm grew from 8.17 to 1.2\d*e\+29"):
        run_experiment(cfg, tmp_path / "run", progress=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.round == 2
    # The checkpoint holds the model of round 2, whose norm the error message reports (8.17).
    assert float(ckpt.theta.norm()) == pytest.approx(8.17, abs=0.005)
    assert [r["round"] for r in read_jsonl(tmp_path / "run" / "rounds.jsonl")] == [1, 2]
    failure = json.loads((tmp_path / "run" / "failure.json").read_text())  # why it stopped, kept with the run
    assert failure["error"] == "DivergenceError" and failure["rounds_done"] == 2
    assert failure["message"].startswith("round 3: the global model's norm grew from 8.17")
    proc = cli("table", str(tmp_path))
    assert proc.returncode == 2  # nothing finished
    assert f"note: left out, failed after 2 rounds: {tmp_path / 'run'}: DivergenceError: round 3:" in proc.stderr
    assert "unfinished run(s) left out" not in proc.stderr  # not counted as merely interrupted


@pytest.mark.needs_data
def test_a_failure_record_goes_when_the_run_finishes(tmp_path: Path) -> None:
    cfg = small_config("method=\"uniform\"", "rounds=4", "checkpoint.period=1")

    def stop(t: int, _: dict) -> None:
        if t == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "run", progress=False, hooks=RunHooks(on_round=stop))
    assert not (tmp_path / "run" / "failure.json").exists()  # interrupted is not failed
    (tmp_path / "run" / "failure.json").write_text('{"error": "DivergenceError", "message": "m", "rounds_done": 2}')
    assert resume_experiment(tmp_path / "run", progress=False)["rounds"] == 4
    assert not (tmp_path / "run" / "failure.json").exists()


@pytest.mark.needs_data
def test_rounds_lost_to_non_finite_training_stop_the_run_but_rounds_lost_to_faults_do_not(tmp_path: Path) -> None:
    """Every client's local SGD overflows: today every round is skipped and the run 'completes'."""
    cfg = small_config("method=\"uniform\"", "rounds=6", "checkpoint.period=1", "train.lr_local=1e6")
    with pytest.raises(DivergenceError, match=r"^round 3: no valid client reply in 3 rounds in a row.*"
                                              r"update has non-finite values.*train\.lr_local=1e\+06"):
        run_experiment(cfg, tmp_path / "run", progress=False)
    rounds = read_jsonl(tmp_path / "run" / "rounds.jsonl")
    assert [r["skipped"] for r in rounds] == [True, True, True]
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt is not None and ckpt.round == 3
    assert torch.equal(ckpt.theta, get_flat(new_model(cfg, small_data(cfg), cfg.seed)))
    # Rounds lost to simulated faults (every update garbled) are expected: that run completes.
    faulty = small_config("method=\"uniform\"", "rounds=4", "faults.corrupt_updates=0.999", "eval.test_period=0")
    assert run_experiment(faulty, tmp_path / "faulty", progress=False)["skipped_rounds"] == 4


@pytest.mark.needs_data
def test_diverged_calibration_is_refused_before_the_run_directory_exists(tmp_path: Path) -> None:
    """Today: a KeyError traceback (calibration rounds without a report)."""
    cfg = small_config("train.lr_local=50", "calibration.rounds=3")
    with pytest.raises(DivergenceError, match=r"^calibration round 1: .*train\.lr_local=50 or train\.lr_global=1\.2"):
        run_experiment(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.needs_data
@pytest.mark.parametrize(("reports", "says"), [
    ([[2.30, 2.31], [3.1, 2.9], [1.5e9, 4.8e9]], ("calibration round 3 (seed 0): the averaged report [1.5e+09, 4.8e+09] "
                                                 "grew past 10x round 1's [2.3, 2.31]")),
    ([[2.30, 2.31], [None, 2.9]], ("calibration round 2 (seed 0): the averaged report [None, 2.9] is missing or "
                                  "non-finite")),
])
def test_a_calibration_whose_reports_exploded_is_refused(reports: list[list[float | None]], says: str) -> None:
    """A stored calibration (resumed run, grid) is checked too. Today: the reference [1.5e9, ...] is used."""
    cfg = small_config()
    rows = [r for r in reports if None not in r]
    reference = (np.max(rows, axis=0) + 0.15).tolist()
    cal = CalibrationResult(reference, reference, 0.15, [0], {"0": reports}, len(reports))
    with pytest.raises(DivergenceError) as err:
        resolve_reference(cfg, small_data(cfg), None, calibration=cal)
    assert says in str(err.value) and "lower train.lr_local=0.3 or train.lr_global=1.2" in str(err.value)


@pytest.mark.needs_data
@pytest.mark.parametrize("bound", ["validation.max_update_norm=100", "validation.max_update_norm_ratio=10"])
def test_update_norm_bounds_reject_poisoned_updates_like_invalid_replies(tmp_path: Path, bound: str) -> None:
    cfg = small_config("method=\"uniform\"", "rounds=8", "faults.poison_updates=0.1", bound)
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    rounds = read_jsonl(tmp_path / "run" / "rounds.jsonl")
    reasons = [x["reason"] for r in rounds for x in r.get("rejected", [])]
    assert len(reasons) == summary["rejected_clients"] == 3
    assert all(f"exceeds {bound.split('=')[0]} = " in reason for reason in reasons), reasons
    assert summary["skipped_rounds"] == 0 and 2.0 < summary["mean_loss"] < 2.5


def test_norm_bounds_unit() -> None:
    spec = ReplySpec(num_tasks=2, dim=4, train_rows=1, max_update_norm=10.0)
    assert reply_problem(ClientReply(0, None, None, torch.full((1, 4), 5.0)), spec) is None  # norm 10
    problem = reply_problem(ClientReply(0, None, None, torch.full((1, 4), 1e30)), spec)
    assert problem == "update norm 2e+30 exceeds validation.max_update_norm = 10"
    ratio = ReplySpec(num_tasks=2, dim=4, gradient_rows=2, train_rows=1, max_norm_ratio=10.0)

    def reply(update: float, grad: float = 1.0) -> ClientReply:
        return ClientReply(0, None, torch.full((2, 4), grad), torch.full((1, 4), update))

    out = norm_outliers([reply(1), reply(2), reply(1e30)], ratio)
    assert out == [None, None, ("update norm 2e+30 exceeds validation.max_update_norm_ratio = 10 x the round's "
                               "lower median 4")]
    # the lower median keeps an honest norm while half the replies are inflated
    assert [p is not None for p in norm_outliers([reply(1), reply(1e30), reply(2), reply(1e29)], ratio)] == [
        False, True, False, True]
    assert [p is not None for p in norm_outliers([reply(1), reply(1, 1e20), reply(1)], ratio)] == [False, True, False]
    assert norm_outliers([reply(1), reply(50)], ReplySpec(2, 4, train_rows=1)) == [None, None]  # off by default


@pytest.mark.needs_data
def test_a_valid_corrupted_reply_is_aggregated_whether_or_not_another_client_is_rejected() -> None:
    """Sequential engine: a poisoned (finite) update is returned as sent, with or without another rejection.

    Today the federation returns the engine's replies untouched when nobody is rejected, so the
    poisoned update is silently dropped, but aggregated as soon as another client is rejected.
    """
    cfg = small_config("engine=\"sequential\"")
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    engine = make_engine(cfg, model, data, 0, "train")
    theta = get_flat(model).clone()
    request = Request(train=np.array([[0.5, 0.5]]))
    # seed 5, round 0: clients 0, 1 and 3 are poisoned; with corrupt_updates on, client 1 is also garbled.
    alone = SimFederation(engine, np.arange(4), 0, FaultInjector(poison_updates=0.3, seed=5))
    got_a = alone.exchange(theta, request)
    other = SimFederation(engine, np.arange(4), 0, FaultInjector(poison_updates=0.3, corrupt_updates=0.3, seed=5))
    got_b = other.exchange(theta, request)
    assert alone.rejected == [] and [c for c, _ in other.rejected] == [1]
    assert got_a.deltas is not None and got_b.deltas is not None
    assert [c for c, d in zip(got_a.clients.tolist(), got_a.deltas) if float(d.norm()) > 1e20] == [0, 1, 3]
    by_client = dict(zip(got_a.clients.tolist(), got_a.deltas))
    for c, d in zip(got_b.clients.tolist(), got_b.deltas):
        assert torch.equal(by_client[c], d), c


@pytest.mark.parametrize(("override", "says"), [
    ("validation.max_update_norm=-1", "validation.max_update_norm = -1.0 must be >= 0"),
    ("validation.max_update_norm_ratio=0.5", "validation.max_update_norm_ratio = 0.5 must be 0 (off) or > 1"),
    ("validation.max_model_growth=1", "validation.max_model_growth = 1.0 must be 0 (off) or > 1"),
    ("validation.divergence_rounds=-2", "validation.divergence_rounds = -2 must be >= 0"),
    ("faults.poison_updates=1.5", "faults.poison_updates = 1.5 must be a probability"),
])
def test_bad_validation_settings_are_refused(override: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        small_config(override)


@pytest.mark.parametrize(("values", "named"), [
    ("[1.0, nan]", "task(s) [1]"),
    ("[-inf, 2.0, inf]", "task(s) [0, 2]"),  # a negative infinity too (it was read as no task at all)
    ("[nan]", "task(s) [0]"),
    ("", "a task"),
])
def test_a_non_finite_report_names_its_tasks_not_the_learning_rates(values: str, named: str) -> None:
    from fedhv.experiment.divergence import cause_hint

    hint = cause_hint(f"report has non-finite values {values}".strip(), "lower train.lr_local=0.1")
    assert f"the loss of {named} (0-based" in hint and "lr_local" not in hint
    assert cause_hint("update has non-finite values", "lower train.lr_local=0.1") == "lower train.lr_local=0.1"
