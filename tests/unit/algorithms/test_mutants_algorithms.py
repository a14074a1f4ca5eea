"""Tests that kill surviving mutants of ``fedhv.algorithms`` (issue 11, docs/testing.md).

Oracles: hand-computed min-norm weights and byte counts, the numpy FedCMOO estimator of
``test_oracles.py`` (keyed by seed, round and client), a separate numpy FindWeights, and
the exact ``StateError`` messages of the checkpoint state round trips.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.algorithms import Replies, UniformAlgorithm
from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOConfig, FedCMOOState
from fedhv.algorithms.fedhv import FedHVState
from fedhv.algorithms.fsmgda import FSMGDAAlgorithm, FSMGDAConfig, FSMGDAState
from fedhv.algorithms.plain import StateError
from fedhv.algorithms.uniform import UniformState
from fedhv.algorithms.validation import ClientReply, ReplySpec, is_non_finite, norm_outliers, row_norms
from unit.algorithms.test_oracles import _gradients, _np_fedcmoo_gram, _slices

from helpers import ScriptedFederation

F64 = torch.float64


# --------------------------------------------------------------------------- FedCMOO


def test_fedcmoo_one_client_round_counts_the_sketch_bytes_by_hand() -> None:
    """k = 1, d_enc = 800, m = 2: near-square 40 x 40, r = 10; factors (40 + 40) * 10 float64."""
    grads = _gradients("noise", 1, 2, 800, 3)
    fed = ScriptedFederation(np.array([7]), [])
    alg = FedCMOOAlgorithm(_slices(800, 3), lr_global=1.0, seed=5)
    alg.gram_estimate(grads, np.array([7]), 0, fed)
    factors = (40 + 40) * 10 * 8
    assert fed.up == factors + 2 * 2 * 8 + (2 * 2 * 2 + 2) * 8  # C_k factors + local Gram; D^T(sumC - C), D^T D, norms
    assert fed.down == factors  # the server's sketch of sum C


def _fedcmoo_round(alg: FedCMOOAlgorithm, state: FedCMOOState, grads: torch.Tensor,
                   clients: np.ndarray) -> tuple[Any, ScriptedFederation]:
    k, _, d = grads.shape
    deltas = torch.zeros(k, 1, d, dtype=F64)
    fed = ScriptedFederation(clients, [Replies(clients, gradients=grads), Replies(clients, deltas=deltas)])
    return alg.round(state, torch.zeros(d, dtype=F64), fed), fed


def _np_find_weights(gram: np.ndarray, start: np.ndarray, lr: float, steps: int, momentum: float) -> np.ndarray:
    """Projected heavy-ball descent on ``w^T G w / 2`` after ``G /= mean_j sqrt(G_jj + 1e-4)^2``
    (two tasks: projection onto the segment ``w_0 + w_1 = 1, w >= 0``)."""
    g = gram / np.mean(np.sqrt(np.diag(gram) + 1e-4)) ** 2
    w = start.copy()
    buf = np.zeros(2)
    for _ in range(steps):
        buf = momentum * buf + g @ w
        x = w - lr * buf
        t = min(max((x[0] - x[1] + 1) / 2, 0.0), 1.0)  # Euclidean projection onto the segment
        w = np.array([t, 1 - t])
    return w


@pytest.mark.parametrize("round_idx", [0, 3])
def test_fedcmoo_round_uses_its_round_counter_and_momentum(round_idx: int) -> None:
    d_enc, head, seed = 800, 3, 5
    grads = _gradients("noise", 3, 2, d_enc, head)
    clients = np.array([2, 11, 5])
    alg = FedCMOOAlgorithm(_slices(d_enc, head), lr_global=1.0, seed=seed, config=FedCMOOConfig(weight_lr=0.05, weight_steps=30, weight_momentum=0.9))
    start = np.array([0.3, 0.7])
    res, _ = _fedcmoo_round(alg, FedCMOOState(start, round_idx), grads, clients)
    enc = grads[:, :, :d_enc].transpose(1, 2).numpy()
    want, _ = _np_fedcmoo_gram(enc, clients, seed, round_idx, direct=False)
    other, _ = _np_fedcmoo_gram(enc, clients, seed, round_idx + 1, direct=False)
    assert np.abs(want - other).max() > 1e-6 * np.abs(want).max()  # the round keys the sketches
    np.testing.assert_allclose(res.log["gram"], want, rtol=0, atol=1e-10 * np.abs(want).max())
    w = _np_find_weights(want, start, 0.05, 30, 0.9)
    assert np.abs(w - _np_find_weights(want, start, 0.05, 30, 0.0)).max() > 1e-3  # momentum matters here
    np.testing.assert_allclose(res.log["weights"], w, rtol=0, atol=1e-9)
    assert set(res.log) == {"weights", "gram"}
    assert res.state.round == round_idx + 1


# --------------------------------------------------------------------------- FSMGDA / Uniform


def test_fsmgda_count_decoders_adds_the_heads_to_the_gram() -> None:
    """Mean updates (enc | head 0 | head 1): task 0 = (1 | 1 | 0), task 1 = (1 | 0 | 1).
    Encoder only: G = [[1, 1], [1, 1]] -> the reference boundary 0.999. With the heads:
    G = [[2, 1], [1, 2]] -> gamma = (2 - 1) / (2 + 2 - 2) = 1/2, norm^2 = 1/4 (2 + 2 + 2) = 1.5."""
    mean = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]], dtype=F64)
    deltas = torch.stack([mean, mean])
    clients = np.array([0, 1])
    for count, lam0, norm_sq in ((True, 0.5, 1.5), (False, 0.999, 1.0)):
        alg = FSMGDAAlgorithm(_slices(1, 1), lr_global=1.0, config=FSMGDAConfig(count_decoders=count))
        res = alg.round(alg.init_state(2), torch.zeros(3, dtype=F64),
                        ScriptedFederation(clients, [Replies(clients, deltas=deltas)]))
        np.testing.assert_allclose(res.log["weights"], [lam0, 1 - lam0], rtol=0, atol=1e-15)
        assert set(res.log) == {"weights", "min_norm_sq"}
        assert res.log["min_norm_sq"] == pytest.approx(norm_sq, abs=1e-12)


def test_uniform_round_logs_the_uniform_weights() -> None:
    clients = np.array([0])
    res = UniformAlgorithm(lr_global=1.0).round(UniformState(3), torch.zeros(2, dtype=F64),
                                       ScriptedFederation(clients, [Replies(clients, deltas=torch.zeros(1, 1, 2))]))
    assert res.log == {"weights": [1 / 3, 1 / 3, 1 / 3]}


# --------------------------------------------------------------------------- reply validation


def _reply(client: int, delta_norm: float, grad_norm: float | None = None) -> ClientReply:
    deltas = torch.tensor([[0.6 * delta_norm, 0.8 * delta_norm]], dtype=F64)
    grads = None if grad_norm is None else torch.tensor([[0.0, grad_norm]], dtype=F64)
    return ClientReply(client, deltas=deltas, gradients=grads)


def test_norm_outliers_against_the_lower_median() -> None:
    """Norms 1, 1.5, 10, rho = 2: lower median = 1.5 (index (3 - 1) // 2 of the sorted norms)."""
    spec = ReplySpec(num_tasks=1, dim=2, train_rows=1, max_norm_ratio=2.0)
    got = norm_outliers([_reply(0, 1.0), _reply(1, 1.5), _reply(2, 10.0)], spec)
    assert got == [None, None, "update norm 10 exceeds validation.max_update_norm_ratio = 2 x the round's lower median 1.5"]


def test_norm_outliers_keeps_the_first_reason_and_checks_gradients() -> None:
    spec = ReplySpec(num_tasks=1, dim=2, train_rows=1, gradient_rows=1, max_norm_ratio=2.0)
    valid = [_reply(0, 1.0, 1.0), _reply(1, 1.0, 1.0), _reply(2, 9.0, 8.0), _reply(3, 1.0, 7.0)]
    got = norm_outliers(valid, spec)
    assert got == [None, None,
                   "update norm 9 exceeds validation.max_update_norm_ratio = 2 x the round's lower median 1",
                   "gradients norm 7 exceeds validation.max_update_norm_ratio = 2 x the round's lower median 1"]


def test_row_norms_and_non_finite_reasons() -> None:
    np.testing.assert_array_equal(row_norms(torch.tensor([[3.0, 4.0], [6.0, 8.0]])), [5.0, 10.0])
    np.testing.assert_array_equal(row_norms(np.array([[3.0, 4.0], [0.0, 1.0]])), [5.0, 1.0])
    assert is_non_finite("deltas has non-finite values")
    assert not is_non_finite("deltas has shape [2] but [1, 2] was expected")


# --------------------------------------------------------------------------- state round trips


def _t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=F64)


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            np.testing.assert_array_equal(x, y)
            assert x.dtype == y.dtype
        else:
            assert x == y


@pytest.mark.parametrize("state", [
    FedHVState(np.array([0.25, 0.75]), np.array([1.5, 2.0])),
    FedHVState(np.array([0.0, 1.0])),
    FedCMOOState(np.array([0.0, 1.0]), 7),
    FSMGDAState(3, np.array([0.2, 0.3, 0.5])),
    FSMGDAState(2),
    UniformState(4),
])
def test_state_round_trip(state: Any) -> None:
    plain = state.to_plain()
    assert set(plain) == {f.name for f in dataclasses.fields(state)}  # every field, no class attribute
    _same(type(state).from_plain(plain), state)


def test_state_plain_keys() -> None:
    assert set(FedCMOOState(np.array([1.0]), 2).to_plain()) == {"weights", "round"}
    assert FedCMOOState(np.array([1.0]), 2).to_plain()["round"] == 2
    assert FSMGDAState(2).to_plain() == {"num_tasks": 2, "last_weights": None}
    assert UniformState(3).to_plain() == {"num_tasks": 3}


BAD = [
    (FedHVState, {"weights": _t(0.5, 0.5)}, "a fedhv state has the fields ['weights', 'last_report'], found ['weights']"),
    (FedHVState, [1], "a fedhv state has the fields ['weights', 'last_report'], found list [1]"),
    (FedHVState, {"weights": torch.ones(2, 2, dtype=F64), "last_report": None},
     "fedhv weights must be a 1-D floating tensor, found a torch.float64 tensor of shape [2, 2]"),
    (FedHVState, {"weights": [0.5, 0.5], "last_report": None},
     "fedhv weights must be a 1-D floating tensor, found list [0.5, 0.5]"),
    (FedHVState, {"weights": _t(0.5, 0.5), "last_report": _t(1.0, math.inf)},
     "fedhv last_report has non-finite values [1.0, inf]"),
    (FedHVState, {"weights": _t(0.5, 0.6), "last_report": None},
     "fedhv weights [0.5, 0.6] are not on the simplex (>= 0, sum 1)"),
    (FedHVState, {"weights": _t(-0.5, 1.5), "last_report": None},
     "fedhv weights [-0.5, 1.5] are not on the simplex (>= 0, sum 1)"),
    (FedHVState, {"weights": _t(0.5, 0.5), "last_report": _t(1.0)},
     "fedhv last_report has 1 values for 2 weights"),
    (FedCMOOState, {"weights": _t(0.5, 0.5)}, "a fedcmoo state has the fields ['weights', 'round'], found ['weights']"),
    (FedCMOOState, {"weights": _t(0.5, 0.7), "round": 0}, "fedcmoo weights [0.5, 0.7] are not on the simplex (>= 0, sum 1)"),
    (FedCMOOState, {"weights": _t(0.5, 0.5), "round": -1}, "fedcmoo round must be an integer >= 0, found int -1"),
    (FedCMOOState, {"weights": _t(0.5, 0.5), "round": True}, "fedcmoo round must be an integer >= 0, found bool True"),
    (FedCMOOState, {"weights": torch.tensor([1, 0]), "round": 0},
     "fedcmoo weights must be a 1-D floating tensor, found a torch.int64 tensor of shape [2]"),
    (FSMGDAState, {"num_tasks": 2}, "a fsmgda state has the fields ['num_tasks', 'last_weights'], found ['num_tasks']"),
    (FSMGDAState, {"num_tasks": 0, "last_weights": None}, "fsmgda num_tasks must be an integer >= 1, found int 0"),
    (FSMGDAState, {"num_tasks": 2, "last_weights": _t(math.nan, 1.0)}, "fsmgda last_weights has non-finite values [nan, 1.0]"),
    (FSMGDAState, {"num_tasks": 2, "last_weights": 3}, "fsmgda last_weights must be a 1-D floating tensor, found int 3"),
    (FSMGDAState, {"num_tasks": 3, "last_weights": _t(0.5, 0.5)}, "fsmgda last_weights has 2 values for 3 tasks"),
    (UniformState, {"num_tasks": 2, "x": 1}, "a uniform state has the fields ['num_tasks'], found ['num_tasks', 'x']"),
    (UniformState, {"num_tasks": 0}, "uniform num_tasks must be an integer >= 1, found int 0"),
    (UniformState, {"num_tasks": 2.0}, "uniform num_tasks must be an integer >= 1, found float 2.0"),
]


@pytest.mark.parametrize(("cls", "data", "message"), BAD)
def test_state_from_plain_rejects(cls: Any, data: Any, message: str) -> None:
    with pytest.raises(StateError, match="^" + re.escape(message) + "$"):
        cls.from_plain(data)
