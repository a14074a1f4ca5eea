"""The batched engine must reproduce the sequential reference engine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedhv.algorithms import FedHVAlgorithm, UniformAlgorithm
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


@pytest.mark.needs_data
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
        alg = FedHVAlgorithm(np.array([2.6, 2.6]), cfg.lr_global, report_batches=cfg.fedhv.report_batches)
        results[engine] = _train(cfg, alg)
    (ts, ss, ls), (tb, sb, lb) = results["sequential"], results["batched"]
    assert (ts - tb).abs().max().item() < 1e-10
    np.testing.assert_allclose(ss.weights, sb.weights, rtol=0, atol=1e-12)
    for a, b in zip(ls, lb):
        np.testing.assert_allclose(a["report"], b["report"], rtol=0, atol=1e-12)
    assert (ts - get_flat(new_model(small_config("dtype='float64'"), small_data(small_config("dtype='float64'")), 0))).abs().max() > 1e-3


@pytest.mark.needs_data
def test_batched_equals_sequential_float32_within_rounding() -> None:
    """Both float32 engines stay within float32 rounding of the float64 run.

    Tolerance, derived: each of the ``S = rounds * (K + 1)`` updates of theta (K local SGD
    steps and one server step per round) rounds theta to float32 and adds a float32
    gradient, an error of order ``eps32 * max|theta|`` (eps32 = 2^-23). The training map
    carries an error forward with an amplification A, measured in float64 on this setup
    by perturbing theta^0 by uniform noise of 3e-8 to 1e-7 per entry: max|delta theta^2| /
    max|delta theta^0| = 1.17 to 1.57 over 12 draws; we take A = 2. Hence
    ``tol = A * S * eps32 * max|theta|`` (~6e-7 here; measured errors ~4e-8, one ulp).
    Perturbations of 3e-7 and more flip max-pool / ReLU choices (amplifications 240 to
    11,700): that, not rounding, is what a 1e-3 tolerance would have let through.
    """
    thetas = {}
    for dtype, engine in (("float64", "sequential"), ("float32", "sequential"), ("float32", "batched")):
        cfg = small_config(f"engine='{engine}'", f"dtype='{dtype}'")
        thetas[dtype, engine] = _train(cfg, UniformAlgorithm(cfg.lr_global), rounds=2)[0].double()
    reference = thetas["float64", "sequential"]
    steps = 2 * (cfg.train.local_steps + 1)
    tol = 2.0 * steps * float(np.finfo(np.float32).eps) * reference.abs().max().item()
    for engine in ("sequential", "batched"):
        assert (thetas["float32", engine] - reference).abs().max().item() <= tol, engine
    assert (thetas["float32", "sequential"] - thetas["float32", "batched"]).abs().max().item() <= tol


def _engines(cfg):  # type: ignore[no-untyped-def]
    data = small_data(cfg)
    seq = make_engine(dataclasses.replace(cfg, engine="sequential"), new_model(cfg, data, 0), data, 0, "t")
    bat = make_engine(dataclasses.replace(cfg, engine="batched"), new_model(cfg, data, 0), data, 0, "t")
    return data, seq, bat


@pytest.mark.needs_data
def test_primitives_agree_between_engines() -> None:
    """Multi-trajectory training (FSMGDA), per-task gradients and a first step taken from
    given gradients (FedCMOO) agree between engines in float64."""
    cfg = small_config("dtype='float64'", "train.momentum=0.3")
    data, seq, bat = _engines(cfg)
    theta = get_flat(new_model(cfg, data, 0)).clone()
    clients = np.array([1, 4, 5])
    eye = np.eye(2)
    g_seq, g_bat = seq.gradients(theta, clients, eye, 0), bat.gradients(theta, clients, eye, 0)
    assert g_seq.shape == (3, 2, theta.numel())
    assert (g_seq - g_bat).abs().max().item() < 1e-12
    d_seq, d_bat = seq.train(theta, clients, eye, 0), bat.train(theta, clients, eye, 0)
    assert (d_seq - d_bat).abs().max().item() < 1e-12
    # A single-task trajectory leaves the other task's head untouched.
    start, stop = seq.layout.slice_of("heads.1.")[0][0], seq.layout.slice_of("heads.1.")[-1][1]
    assert d_seq[:, 0, start:stop].abs().max().item() == 0.0 and d_seq[:, 1, start:stop].abs().max().item() > 0
    w = np.array([[0.3, 0.7]])
    first = torch.einsum("t,ktd->kd", torch.tensor(w[0], dtype=torch.float64), g_seq).unsqueeze(1)
    f_seq = seq.train(theta, clients, w, 0, first_step=first)
    f_bat = bat.train(theta, clients, w, 0, first_step=first)
    assert (f_seq - f_bat).abs().max().item() < 1e-12
    assert (f_seq - seq.train(theta, clients, w, 0)).abs().max().item() > 1e-6


@pytest.mark.needs_data
def test_chunked_batched_engine_matches_unchunked() -> None:
    cfg = small_config("dtype='float64'")
    data, _, full = _engines(cfg)
    theta = get_flat(new_model(cfg, data, 0)).clone()
    clients = np.arange(4)
    w = np.eye(2)
    reference = full.train(theta, clients, w, 0)
    full.chunk = 3
    assert (full.train(theta, clients, w, 0) - reference).abs().max().item() < 1e-12
    assert (full.gradients(theta, clients, w, 0) - _engines(cfg)[2].gradients(theta, clients, w, 0)).abs().max() < 1e-12


@pytest.mark.needs_data
def test_reports_are_losses_at_the_broadcast_model() -> None:
    """A FedHV report is each client's mean task loss at theta^t over its local data, in eval mode."""
    cfg = small_config("dtype='float64'")
    data, seq, bat = _engines(cfg)
    theta = get_flat(new_model(cfg, data, 0)).clone()
    clients = np.array([0, 2, 5])
    reports = bat.reports(theta, clients, 0, "all")
    torch.testing.assert_close(seq.reports(theta, clients, 0, "all"), reports, rtol=0, atol=1e-12)
    probe = new_model(cfg, data, 1).eval()
    set_flat(probe, theta)
    for row, c in enumerate(clients):
        idx = data.parts[c]
        losses, _ = per_sample_losses(probe, data.train_x[idx], data.train_y[idx])
        torch.testing.assert_close(reports[row], losses.mean(0), rtol=0, atol=1e-12)


@pytest.mark.needs_data
@pytest.mark.parametrize("method", ["fsmgda", "fedcmoo", "uniform"])
def test_methods_equal_across_engines(method: str) -> None:
    """Whole rounds of every method agree between the batched and the sequential engine."""
    from fedhv.experiment.method_setup import build_method

    thetas = {}
    for engine in ("sequential", "batched"):
        cfg = small_config("dtype='float64'", f"engine='{engine}'", f"method='{method}'")
        data = small_data(cfg)
        alg = build_method(cfg, data).algorithm
        thetas[engine] = _train(cfg, alg, rounds=2)[0]
    assert (thetas["sequential"] - thetas["batched"]).abs().max().item() < 1e-10


@pytest.mark.needs_data
def test_cifar_mnist_engines_agree_with_rotation_and_flips() -> None:
    """CIFAR10-MNIST: integer nearest rotations and whole-batch flips from shared plans."""
    thetas = {}
    for engine in ("sequential", "batched"):
        cfg = small_config("dtype='float64'", f"engine='{engine}'", "method='uniform'", "data.flip_prob=0.5",
                           setting="cifar10-mnist-b")
        data = small_data(cfg)
        assert data.augment is not None and data.augment.integer_angles and data.augment.interpolation == "nearest"
        alg = UniformAlgorithm(cfg.lr_global)
        thetas[engine] = _train(cfg, alg, rounds=2)[0]
    assert (thetas["sequential"] - thetas["batched"]).abs().max().item() < 1e-10


def test_plans_draw_integer_angles_and_batch_flips() -> None:
    from fedhv.data.augment import Augment
    from fedhv.sim.plan import client_plan

    aug = Augment(rotation_degrees=30, integer_angles=True, interpolation="nearest", flip_prob=0.4)
    plan = client_plan(0, "s", 0, 0, torch.arange(640), 400, 1, aug, {}, 0.5)
    assert plan.angles is not None and plan.flips is not None
    assert torch.equal(plan.angles, plan.angles.round()) and plan.angles.min() == -30 and plan.angles.max() == 30
    assert abs(plan.flips.double().mean().item() - 0.4) < 0.08
    plain = client_plan(0, "s", 0, 0, torch.arange(640), 4, 16, Augment(rotation_degrees=25), {}, 0.5)
    assert plain.flips is None and plain.angles is not None and plain.angles.abs().max() < 25


@pytest.mark.needs_data
@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_reports_are_chunked_by_the_eval_batch_size(engine: str) -> None:
    """Both engines take their report chunk from ``eval.batch_size`` (ResNet-18-GN: 2,048 at once is 1.5x slower)."""
    cfg = small_config(f"engine={engine}", "eval.batch_size=37")
    data = small_data(cfg)
    assert make_engine(cfg, new_model(cfg, data, 0), data, 0, "train").eval_batch_size == 37
