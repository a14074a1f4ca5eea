"""The batched engine must reproduce the sequential reference engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhv.algorithms import FedHV, Uniform
from fedhv.experiment.loop import run_rounds
from fedhv.experiment.setup import make_engine, new_model
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models import get_flat, set_flat

from helpers import small_config, small_data


def _train(cfg, algorithm, rounds: int = 3):  # type: ignore[no-untyped-def]
    data = small_data(cfg)
    model = new_model(cfg, data, cfg.seed)
    engine = make_engine(cfg, model, data, cfg.seed, "train")
    logs = []
    theta, state = run_rounds(
        algorithm, engine, data, get_flat(model).clone(), rounds, cfg.train.clients_per_round, cfg.seed, "train",
        lambda rec, th, st: logs.append(rec.log),
    )
    return theta, state, logs


@pytest.mark.parametrize(
    "extra",
    [
        ("train.momentum=0.0",),
        ("train.momentum=0.5", "fedhv.report_batches=2"),
    ],
)
def test_batched_equals_sequential_float64(extra: tuple[str, ...]) -> None:
    """Dropout masks, augmentation and batches come from shared plans, so both engines
    see the same randomness; in float64 they agree to rounding."""
    results = {}
    for engine in ("sequential", "batched"):
        cfg = small_config("dtype='float64'", f"engine='{engine}'", *extra)
        alg = FedHV(np.array([2.6, 2.6]), cfg.lr_global, report_batches=cfg.fedhv.report_batches)
        results[engine] = _train(cfg, alg)
    (ts, ss, ls), (tb, sb, lb) = results["sequential"], results["batched"]
    assert (ts - tb).abs().max().item() < 1e-10
    np.testing.assert_allclose(ss.weights, sb.weights, rtol=0, atol=1e-12)
    for a, b in zip(ls, lb):
        np.testing.assert_allclose(a["report"], b["report"], rtol=0, atol=1e-12)
    assert (ts - get_flat(new_model(small_config("dtype='float64'"), small_data(small_config("dtype='float64'")), 0))).abs().max() > 1e-3


def test_batched_equals_sequential_float32_within_rounding() -> None:
    out = []
    for engine in ("sequential", "batched"):
        cfg = small_config(f"engine='{engine}'")
        out.append(_train(cfg, Uniform(cfg.lr_global), rounds=2)[0])
    assert (out[0] - out[1]).abs().max().item() < 1e-3


def test_chunked_batched_engine_matches_unchunked() -> None:
    cfg = small_config("dtype='float64'")
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    theta = get_flat(model).clone()
    clients = np.arange(4)
    alg = FedHV(np.array([2.6, 2.6]), cfg.lr_global)
    request = alg.request(alg.init_state(2))
    full = make_engine(cfg, model, data, 0, "train").run_clients(theta, clients, request, 0)
    chunked_engine = make_engine(cfg, new_model(cfg, data, 0), data, 0, "train")
    chunked_engine.chunk = 3
    chunked = chunked_engine.run_clients(theta, clients, request, 0)
    assert (full.deltas - chunked.deltas).abs().max().item() < 1e-12


def test_reports_are_losses_at_the_broadcast_model() -> None:
    """A FedHV report is each client's mean task loss at theta^t over its local data, in eval mode."""
    cfg = small_config("dtype='float64'")
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    theta = get_flat(model).clone()
    clients = np.array([0, 2, 5])
    alg = FedHV(np.array([2.6, 2.6]), cfg.lr_global)
    replies = make_engine(cfg, model, data, 0, "train").run_clients(theta, clients, alg.request(alg.init_state(2)), 0)
    probe = new_model(cfg, data, 1).eval()
    set_flat(probe, theta)
    for row, c in enumerate(clients):
        idx = data.parts[c]
        losses, _ = per_sample_losses(probe, data.train_x[idx], data.train_y[idx])
        torch.testing.assert_close(replies.reports[row], losses.mean(0), rtol=0, atol=1e-12)
