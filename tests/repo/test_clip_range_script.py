"""``perf/secure_clip_range.py``: its per-round maxima of what SecAgg+ would mask are the maxima
of the clients' updates and reports, recomputed here independently with the sequential engine."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest

from fedhv.config import load_config
from fedhv.experiment.setup import federated_data, new_model, sample_clients
from fedhv.models import get_flat
from fedhv.sim.engine import SequentialEngine
from fedhv.weighting import hv_weights

from conftest import REPO, SMALL

pytestmark = pytest.mark.needs_data  # every test here reads the real data

SCRIPT = REPO / "perf" / "secure_clip_range.py"
REFERENCE = [3.0, 3.0]  # above MultiMNIST's initial losses (about 2.3)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("secure_clip_range", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _sequential(cfg, data):  # type: ignore[no-untyped-def]
    return SequentialEngine(new_model(cfg, data, cfg.seed), data, local_steps=cfg.train.local_steps,
                            batch_size=cfg.train.batch_size, lr_local=cfg.lr_local, momentum=cfg.train.momentum,
                            seed=cfg.seed, stream="train")


def test_maxima_and_clip_counts_match_the_clients_values() -> None:
    """FedHV, two rounds, float64, a clipping range that clips some update coordinates and every report:
    max |update|, max |report|, RMS and the clipped count equal those of the sequential engine's replies."""
    c = 0.05
    cfg = load_config("multimnist", [*SMALL, "rounds=2", "dtype=float64", "method=fedhv",
                                     f"fedhv.reference={REFERENCE}"])
    result = _script().measure(cfg, clipping_range=c)
    rounds = result["rounds"]
    assert [(r["stream"], r["round"]) for r in rounds] == [("train", 1), ("train", 2)]

    data = federated_data(cfg)
    engine = _sequential(cfg, data)
    theta = get_flat(new_model(cfg, data, cfg.seed)).clone()
    weights = np.full(data.num_tasks, 1.0 / data.num_tasks)
    for t, got in enumerate(rounds):
        clients = sample_clients(cfg.seed, "train", t, data.num_clients, cfg.train.clients_per_round)
        reports = engine.reports(theta, clients, t, "all")
        deltas = engine.train(theta, clients, weights[None, :], t)
        clipped = int((deltas.abs() > c).sum() + (reports.abs() > c).sum())
        assert 0 < int((deltas.abs() > c).sum()) < deltas.numel()  # the range splits the coordinates
        assert got["max_update"] == pytest.approx(float(deltas.abs().max()), rel=1e-9)
        assert got["max_report"] == pytest.approx(float(reports.abs().max()), rel=1e-9)
        assert got["rms_update"] == pytest.approx(float(deltas.pow(2).mean().sqrt()), rel=1e-9)
        assert got["clipped"] == clipped
        assert got["update_headroom"] == pytest.approx(c / got["max_update"])
        assert got["report_margin"] == pytest.approx(c - got["max_report"])
        theta = theta + cfg.lr_global * deltas[:, 0].mean(0)
        weights = hv_weights(reports.double().mean(0).numpy(), np.asarray(REFERENCE), cfg.fedhv.rho_clip).weights
    summary = result["summary"]
    assert summary["max_update"] == max(r["max_update"] for r in rounds)
    assert summary["clipped"] == sum(r["clipped"] for r in rounds)


def test_fsmgda_counts_every_task_trajectory_and_calibration_rounds_are_measured() -> None:
    """FSMGDA masks ``[m, d]`` per client (one update per task): the maximum is over all rows. FedHV
    with a calibration on the training partition: the calibration rounds come first."""
    script = _script()
    cfg = load_config("multimnist", [*SMALL, "rounds=1", "dtype=float64", "method=fsmgda"])
    got = script.measure(cfg)["rounds"]
    data = federated_data(cfg)
    clients = sample_clients(cfg.seed, "train", 0, data.num_clients, cfg.train.clients_per_round)
    theta = get_flat(new_model(cfg, data, cfg.seed)).clone()
    deltas = _sequential(cfg, data).train(theta, clients, np.eye(data.num_tasks), 0)
    assert got[0]["rows"] == data.num_tasks and got[0]["max_report"] is None
    assert got[0]["max_update"] == pytest.approx(float(deltas.abs().max()), rel=1e-9)
    assert float(deltas[:, 1].abs().max()) != float(deltas[:, 0].abs().max())  # both rows matter

    cfg = load_config("multimnist", [*SMALL, "rounds=1", "method=fedhv"])
    result = script.measure(cfg)
    assert [(r["stream"], r["round"]) for r in result["rounds"]] == [("calibration", 1), ("calibration", 2),
                                                                      ("train", 1)]
    assert result["reference_source"] == "calibration"
    cal = np.asarray([r["mean_report"] for r in result["rounds"][:2]])  # r_i = max_t F_i^t + margin
    assert result["reference"] == pytest.approx((cal.max(0) + cfg.calibration.margin).tolist(), rel=1e-6)
    assert all(r["max_report"] > 0 and np.isfinite(r["max_update"]) for r in result["rounds"])
