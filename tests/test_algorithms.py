"""FedHV and Uniform round logic, and the calibration rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhv.algorithms import FedHV, Replies, Uniform
from fedhv.experiment.calibration import calibrate
from fedhv.weighting import hv_weights

from helpers import ScriptedFederation, small_config, small_data


def test_fedhv_round_logic() -> None:
    ref = np.array([2.5, 2.4])
    alg = FedHV(ref, lr_global=1.2)
    state = alg.init_state(2)
    np.testing.assert_array_equal(state.weights, [0.5, 0.5])  # w^0 = 1/m
    theta = torch.zeros(4, dtype=torch.float64)
    deltas = torch.tensor([[[1.0, 0, 0, 2]], [[3.0, 0, 0, -2]]], dtype=torch.float64)
    reports = torch.tensor([[2.0, 1.0], [1.0, 1.4]], dtype=torch.float64)
    fed = ScriptedFederation(np.array([3, 7]), [Replies(np.array([3, 7]), reports=reports, deltas=deltas)])
    res = alg.round(state, theta, fed)
    (req,) = fed.requests  # one synchronization stage
    assert req.report == "all" and req.send_model
    np.testing.assert_array_equal(req.train, [[0.5, 0.5]])
    np.testing.assert_array_equal(req.payload["weights"], [0.5, 0.5])  # w^t travels with the model
    torch.testing.assert_close(res.theta, torch.tensor([2.4, 0, 0, 0], dtype=torch.float64))  # 1.2 * mean
    f_bar = np.array([1.5, 1.2])
    np.testing.assert_allclose(res.state.weights, hv_weights(f_bar, ref).weights)  # w^1 = W(F^0; r)
    slack = ref - f_bar
    np.testing.assert_allclose(res.state.weights, (1 / slack) / (1 / slack).sum())
    assert res.log["weights"] == [0.5, 0.5] and res.log["min_slack"] == pytest.approx(1.0)
    assert res.log["floor_activations"] == 0
    # The next round trains with the new weights (one-round-delayed weighting).
    fed2 = ScriptedFederation(np.array([0]), [Replies(np.array([0]), reports=reports[:1], deltas=deltas[:1])])
    alg.round(res.state, res.theta, fed2)
    np.testing.assert_allclose(fed2.requests[0].train[0], res.state.weights)


def test_fedhv_floor_activation_is_counted() -> None:
    alg = FedHV(np.array([2.0, 2.0]), lr_global=1.0, rho_clip=1e-6)
    replies = Replies(np.array([0]), reports=torch.tensor([[2.5, 1.0]]), deltas=torch.zeros(1, 1, 3))
    res = alg.round(alg.init_state(2), torch.zeros(3), ScriptedFederation(np.array([0]), [replies]))
    assert res.log["floor_activations"] == 1 and res.log["min_slack"] == pytest.approx(-0.5)
    assert res.state.weights[0] > 0.999999


def test_uniform_has_fixed_weights_and_no_reports() -> None:
    alg = Uniform(lr_global=1.0)
    fed = ScriptedFederation(np.array([0]), [Replies(np.array([0]), deltas=torch.ones(1, 1, 2))])
    res = alg.round(alg.init_state(3), torch.zeros(2), fed)
    (req,) = fed.requests
    np.testing.assert_allclose(req.train, [[1 / 3] * 3])
    assert req.report is None and not req.payload
    torch.testing.assert_close(res.theta, torch.ones(2))


def test_calibration_reference_is_max_report_plus_margin() -> None:
    cfg = small_config("calibration.rounds=3", "calibration.seeds=[0, 42]", "calibration.margin=0.15")
    result = calibrate(cfg, small_data(cfg))
    reports = np.array([row for rows in result.reports.values() for row in rows])
    assert reports.shape == (6, 2) and result.rounds == 6
    np.testing.assert_allclose(result.reference, reports.max(0) + 0.15)
    # Initial losses of a 10-class head are near ln(10); the reference sits above them.
    assert np.all(np.abs(reports[0] - np.log(10)) < 0.2)
    m = cfg.train.clients_per_round
    assert result.bytes_down > 0 and result.bytes_up == result.bytes_down + 6 * m * 2 * 4
