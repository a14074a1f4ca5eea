"""FedHV and Uniform round logic, and the calibration rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhv.algorithms import FedHVAlgorithm, Replies, UniformAlgorithm
from fedhv.experiment.calibration import calibrate
from fedhv.weighting import hv_weights

from helpers import ScriptedFederation, small_config, small_data


def test_fedhv_round_logic() -> None:
    ref = np.array([2.5, 2.4])
    alg = FedHVAlgorithm(ref, lr_global=1.2)
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
    alg = FedHVAlgorithm(np.array([2.0, 2.0]), lr_global=1.0, rho_clip=1e-6)
    replies = Replies(np.array([0]), reports=torch.tensor([[2.5, 1.0]]), deltas=torch.zeros(1, 1, 3))
    res = alg.round(alg.init_state(2), torch.zeros(3), ScriptedFederation(np.array([0]), [replies]))
    assert res.log["floor_activations"] == 1 and res.log["min_slack"] == pytest.approx(-0.5)
    assert res.state.weights[0] > 0.999999


def test_uniform_has_fixed_weights_and_no_reports() -> None:
    alg = UniformAlgorithm(lr_global=1.0)
    fed = ScriptedFederation(np.array([0]), [Replies(np.array([0]), deltas=torch.ones(1, 1, 2))])
    res = alg.round(alg.init_state(3), torch.zeros(2), fed)
    (req,) = fed.requests
    np.testing.assert_allclose(req.train, [[1 / 3] * 3])
    assert req.report is None and not req.payload
    torch.testing.assert_close(res.theta, torch.ones(2))


@pytest.mark.needs_data
def test_calibration_reference_is_max_report_plus_margin() -> None:
    cfg = small_config("calibration.rounds=3", "calibration.seeds=[0, 42]", "calibration.margin=0.15")
    result = calibrate(cfg, small_data(cfg))
    reports = np.array([row for rows in result.reports.values() for row in rows])
    assert reports.shape == (6, 2) and result.rounds == 6
    np.testing.assert_allclose(result.reference, reports.max(0) + 0.15)
    # Initial losses of a 10-class head are near ln(10); the reference sits above them.
    assert np.all(np.abs(reports[0] - np.log(10)) < 0.2)
    m = cfg.train.clients_per_round
    # Per calibration round and client: the float32 model down; the update and the 2-task report up.
    d = 28_515 + 2 * 3_060  # LeNet encoder + two heads
    assert result.bytes_down == 6 * m * 4 * d and result.bytes_up == result.bytes_down + 6 * m * 2 * 4


def _slices(d_enc: int, head: int, m: int = 2):  # type: ignore[no-untyped-def]
    from fedhv.models.params import TaskSlices

    heads = tuple(torch.arange(d_enc + t * head, d_enc + (t + 1) * head) for t in range(m))
    return TaskSlices(torch.arange(d_enc), heads)


def test_fsmgda_round_logic() -> None:
    from fedhv.algorithms.fsmgda import FSMGDAAlgorithm, FSMGDAConfig
    from fedhv.weighting import min_norm_two

    slices = _slices(2, 1)  # theta = [enc0, enc1, head0, head1]
    alg = FSMGDAAlgorithm(slices, lr_global=2.0)
    # Two clients; task 0 moves enc + head0, task 1 moves enc + head1.
    deltas = torch.tensor(
        [[[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 1.0]], [[1.0, 0.0, 0.5, 0.0], [0.0, 2.0, 0.0, 3.0]]],
        dtype=torch.float64,
    )
    fed = ScriptedFederation(np.array([0, 1]), [Replies(np.array([0, 1]), deltas=deltas)])
    res = alg.round(alg.init_state(2), torch.zeros(4, dtype=torch.float64), fed)
    (req,) = fed.requests
    np.testing.assert_array_equal(req.train, np.eye(2))  # one single-task trajectory per task
    lam = min_norm_two(np.array([[1.0, 0.0], [0.0, 4.0]]), reference_clip=True)
    np.testing.assert_allclose(lam, [0.8, 0.2])
    np.testing.assert_allclose(res.log["weights"], lam)
    expected = 2.0 * np.array([0.8 * 1.0, 0.2 * 2.0, 0.8 * 0.5, 0.2 * 2.0])
    np.testing.assert_allclose(res.theta.numpy(), expected)
    # Without scale_decoders the heads take the full averaged task update.
    alg2 = FSMGDAAlgorithm(slices, lr_global=2.0, config=FSMGDAConfig(scale_decoders=False))
    fed2 = ScriptedFederation(np.array([0, 1]), [Replies(np.array([0, 1]), deltas=deltas)])
    res2 = alg2.round(alg2.init_state(2), torch.zeros(4, dtype=torch.float64), fed2)
    np.testing.assert_allclose(res2.theta.numpy()[2:], 2.0 * np.array([0.5, 2.0]))


def test_fedcmoo_round_structure() -> None:
    from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOConfig, find_weights

    d = 50
    slices = _slices(d - 2, 1)
    alg = FedCMOOAlgorithm(slices, lr_global=1.5, config=FedCMOOConfig(estimator="randsvd-direct", extra_upload=4.0))
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(3, 2, d, generator=gen, dtype=torch.float64)
    deltas = torch.randn(3, 1, d, generator=gen, dtype=torch.float64)
    clients = np.array([0, 1, 2])
    fed = ScriptedFederation(clients, [Replies(clients, gradients=grads), Replies(clients, deltas=deltas)])
    state = alg.init_state(2)
    res = alg.round(state, torch.zeros(d, dtype=torch.float64), fed)
    g_req, t_req = fed.requests
    np.testing.assert_array_equal(g_req.gradients, np.eye(2))
    assert not g_req.upload_gradients and g_req.send_model
    assert not t_req.send_model and set(t_req.payload) == {"weights"}
    w = res.state.weights
    np.testing.assert_allclose(t_req.train, [w])
    torch.testing.assert_close(t_req.first_step[:, 0], torch.einsum("i,kid->kd", torch.tensor(w), grads))
    enc = grads[:, :, slices.encoder].sum(0)
    np.testing.assert_allclose(w, find_weights((enc @ enc.T).numpy() / 3, np.array([0.5, 0.5])), rtol=1e-6)
    torch.testing.assert_close(res.theta, 1.5 * deltas[:, 0].mean(0))
    assert res.state.round == 1
