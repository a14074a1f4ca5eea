"""The Gramian methods (UPGrad, DualProj, CAGrad, PCGrad, IMTL-G, Aligned-MTL on FSMGDA's and FedCMOO's
exchanges; FedMGDA+; FedCMOO-Pref).

Each rule's weights against an oracle written here from the authors' definitions (SciPy's SLSQP for the
quadratic and cone programs, numpy for the closed forms, cvxpy for EPO's linear programs as the authors
write them); an FSMGDA-exchange round against torchjd's *aggregator* applied to the task-update matrix;
the state through the checkpoint's plain form, both engines in float64, an interrupted run resumed bit for
bit; the communication each exchange counts; configuration errors before round 1.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fedhv.algorithms import Replies
from fedhv.algorithms.aggregators import IMTLG, AlignedMTL, CAGrad, DualProj, PCGrad, UPGrad
from fedhv.algorithms.fedcmoo_pref import EPORule, epo_alpha
from fedhv.algorithms.fedmgda_plus import FedMGDAPlusRule
from fedhv.algorithms.gramian import GramianInputs, GramianState
from fedhv.algorithms.plain import StateError
from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.models.params import TaskSlices
from fedhv.registry import METHODS

from helpers import ScriptedFederation, assert_resume_is_bit_identical, small_config

F64 = torch.float64
RNG = np.random.default_rng(11)
#: Jacobians with conflicting rows (m = 2, 3, 4) whose Gramians the rules are tested on.
#: Every method on a Gramian exchange (the rules FSMGDA and FedCMOO added, FedMGDA+, FedCMOO-Pref).
GRAMIAN_METHODS = [n for n in METHODS.names() if n.startswith(("fsmgda-", "fedcmoo-")) or n == "fedmgda-plus"]
JACOBIANS = [np.array([[1.0, 0.2, -0.3], [-0.8, 0.9, 0.1]]),
             RNG.normal(size=(3, 6)) * np.array([[1.0], [0.1], [3.0]]),
             RNG.normal(size=(4, 7))]


def inputs(j: np.ndarray, scale: float = 1.0, round_index: int = 0, seed: int = 0) -> GramianInputs:
    g = scale * (j @ j.T)
    return GramianInputs(g, np.full(len(g), 1 / len(g)), round_index, seed)


def dual_cone_weights(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``argmin_v v^T G v`` s.t. ``v >= u`` (torchjd's Proposition 1), by SLSQP."""
    res = minimize(lambda v: v @ g @ v, np.maximum(u, 0) + 1.0, jac=lambda v: 2 * g @ v,
                   constraints=[{"type": "ineq", "fun": lambda v: v - u, "jac": lambda v: np.eye(len(u))}],
                   method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    return res.x


def regularised(g: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    return g / np.trace(g) + eps * np.eye(len(g))


@pytest.mark.parametrize("j", JACOBIANS, ids=["m2", "m3", "m4"])
def test_projection_rules_against_their_quadratic_programs(j: np.ndarray) -> None:
    m = len(j)
    g = regularised(j @ j.T)
    upgrad = sum(dual_cone_weights(g, np.eye(m)[i] / m) for i in range(m))
    np.testing.assert_allclose(UPGrad().weights(inputs(j)), upgrad, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(DualProj().weights(inputs(j)), dual_cone_weights(g, np.full(m, 1 / m)),
                               rtol=2e-5, atol=1e-7)
    # the projected direction has a non-negative inner product with every task (up to the regularisation)
    w = UPGrad(reg_eps=0.0).weights(inputs(j))
    assert (j @ (j.T @ w) >= -1e-9).all()


@pytest.mark.parametrize("j", JACOBIANS, ids=["m2", "m3", "m4"])
def test_cagrad_against_the_authors_scipy_program(j: np.ndarray) -> None:
    """Cranial-XIX/CAGrad's ``cagrad``: ``min_w w^T A b + c sqrt(w^T A w)``, ``b = 1/m``, ``c = alpha ||g_0||``,
    then ``g = g_0 + (c / ||g_w||) g_w`` -- weights ``1/m + (c / ||g_w||) w``; ``alpha = 0.4`` as the authors'
    scripts run it, and their ``rescale = 1`` divides by ``1 + alpha^2``."""
    m, alpha = len(j), 0.4
    assert CAGrad().c == alpha and not CAGrad().rescale
    a = j @ j.T
    b = np.full(m, 1 / m)
    c = alpha * np.sqrt(b @ a @ b)
    res = minimize(lambda x: x @ a @ b + c * np.sqrt(x @ a @ x + 1e-12), b, bounds=[(0, 1)] * m,
                   constraints={"type": "eq", "fun": lambda x: 1 - x.sum()}, method="SLSQP",
                   options={"ftol": 1e-14, "maxiter": 1000})
    expected = b + c / np.sqrt(res.x @ a @ res.x) * res.x
    for scale in (1.0, 1e-7):  # below torchjd's own trace threshold the weights must not change
        np.testing.assert_allclose(CAGrad().weights(inputs(j, scale)), expected, rtol=2e-4, atol=1e-6)
    plain = CAGrad().weights(inputs(j))
    np.testing.assert_allclose(CAGrad(rescale=True).weights(inputs(j)), plain / (1 + alpha ** 2), rtol=1e-12)


def test_pcgrad_two_tasks_closed_form_and_a_seeded_order() -> None:
    j = JACOBIANS[0]
    g = j @ j.T
    assert g[0, 1] < 0  # conflicting: each task loses its component along the other
    v1 = np.array([1.0, -g[0, 1] / g[1, 1]])
    v2 = np.array([-g[0, 1] / g[0, 0], 1.0])
    np.testing.assert_allclose(PCGrad().weights(inputs(j)), (v1 + v2) / 2, rtol=1e-12)  # the mean, not the sum
    j4 = JACOBIANS[2]
    before = torch.get_rng_state()
    a = [PCGrad().weights(inputs(j4, round_index=t, seed=3)) for t in range(6)]
    assert torch.equal(torch.get_rng_state(), before)  # the global generator is left alone
    b = [PCGrad().weights(inputs(j4, round_index=t, seed=3)) for t in range(6)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert len({tuple(x) for x in a}) > 1  # the order is drawn per round (and changes the weights here)
    # against the authors' loop on the rows themselves, with the order our stream drew
    for t, w in enumerate(a):
        from fedhv.rng import derive_seed

        torch.manual_seed(derive_seed(3, "pcgrad", t))
        projected = []
        for i in range(4):
            order = torch.randperm(4).tolist()
            gi = j4[i].copy()
            for k in order:
                if k != i and gi @ j4[k] < 0:
                    gi = gi - (gi @ j4[k]) / (j4[k] @ j4[k]) * j4[k]
            projected.append(gi)
        np.testing.assert_allclose(j4.T @ w, np.mean(projected, axis=0), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("j", JACOBIANS, ids=["m2", "m3", "m4"])
def test_imtlg_and_aligned_mtl_closed_forms(j: np.ndarray) -> None:
    g = j @ j.T
    d = np.sqrt(np.diag(g))
    v = np.linalg.pinv(g) @ d
    np.testing.assert_allclose(IMTLG().weights(inputs(j, 1e-6)), v / v.sum(), rtol=1e-8)
    u = j.T @ (v / v.sum())  # IMTL-G: equal projections on every unit task direction
    proj = (j @ u) / np.linalg.norm(j, axis=1)
    np.testing.assert_allclose(proj, proj[0], rtol=1e-8)
    for mode in ("min", "median", "rmse"):
        np.testing.assert_allclose(AlignedMTL(mode).weights(inputs(j)), aligned_mtl_oracle(g, mode), rtol=1e-12)


def aligned_mtl_oracle(g: np.ndarray, mode: str = "min") -> np.ndarray:
    """The authors' weights (``SamsungLabs/MTL``, ``ProcrustesSolver.apply`` then ``weights.sum(-1)`` in
    ``AlignedMTLBalancer.step``), restated in numpy: the eigenpairs of ``G`` above ``lambda_max m eps``,
    ``B = sqrt(lambda_s) V Sigma^{-1/2} V^T`` with ``lambda_s`` the smallest kept (``"min"``), the median
    (``torch.median``: the lower middle value) or the mean (``"rmse"``), and ``w = B 1``, the *sum*."""
    lam, vec = np.linalg.eigh(g)
    keep = lam > lam.max() * len(g) * np.finfo(np.float64).eps
    lam, vec = lam[keep], vec[:, keep]
    scale = {"min": lam.min(), "median": np.sort(lam)[(len(lam) - 1) // 2], "rmse": lam.mean()}[mode]
    b = np.sqrt(scale) * vec @ np.diag(lam ** -0.5) @ vec.T
    return b.sum(1)


def test_aligned_mtl_equals_its_authors_formula_at_their_scale() -> None:
    """Golden values on fixed Gramians (full rank, rank-deficient, badly scaled) at 1e-12: the authors' ``B 1``,
    ``m`` times torchjd's averaged ``B 1/m`` (an average would be off by the factor ``m``)."""
    j3 = np.array([[1.0, 0.5, -0.2, 0.0], [-0.7, 1.2, 0.3, 0.1], [0.2, -0.1, 0.05, 2.0]])
    rank2 = np.vstack([j3[:2], j3[0] + j3[1]])  # three tasks, two directions
    for j in (j3, rank2, j3 * np.array([[1e-3], [1.0], [30.0]])):
        g = j @ j.T
        for mode in ("min", "median", "rmse"):
            got = AlignedMTL(mode).weights(inputs(j))
            np.testing.assert_allclose(got, aligned_mtl_oracle(g, mode), rtol=1e-12, atol=1e-12 * np.abs(got).max())
    # full rank: J^T B has orthogonal columns of norm sqrt(lambda_min), so the step J^T w = J^T B 1 has squared
    # norm m lambda_min (the averaged B 1/m would have lambda_min / m)
    w = AlignedMTL().weights(inputs(j3))
    assert AlignedMTL().scale_mode == "min"
    lam = np.linalg.eigvalsh(j3 @ j3.T)
    np.testing.assert_allclose(np.sum((j3.T @ w) ** 2), 3 * lam.min(), rtol=1e-10)


def test_fedmgda_plus_box_constrained_min_norm_of_normalised_updates() -> None:
    j = JACOBIANS[0] * np.array([[10.0], [0.1]])  # very different update norms
    g = j @ j.T
    n = np.sqrt(np.diag(g)) + 1e-8
    gn = g / np.outer(n, n)
    for eps in (0.0, 0.1, 0.5):
        lam1 = (gn[1, 1] - gn[0, 1]) / (gn[0, 0] + gn[1, 1] - 2 * gn[0, 1])  # the unconstrained 1-D minimiser
        lam1 = np.clip(lam1, max(0.0, 0.5 - eps), min(1.0, 0.5 + eps))
        np.testing.assert_allclose(FedMGDAPlusRule(eps).weights(inputs(j)), np.array([lam1, 1 - lam1]) / n,
                                   rtol=1e-6)
    j3 = JACOBIANS[1]
    g3 = j3 @ j3.T
    n3 = np.sqrt(np.diag(g3)) + 1e-8
    gn3 = g3 / np.outer(n3, n3)
    box = [(1 / 3 - 0.1, 1 / 3 + 0.1)] * 3
    res = minimize(lambda x: x @ gn3 @ x, np.full(3, 1 / 3), bounds=box, method="SLSQP",
                   constraints={"type": "eq", "fun": lambda x: 1 - x.sum()}, options={"ftol": 1e-15})
    np.testing.assert_allclose(FedMGDAPlusRule(0.1).weights(inputs(j3)), res.x / n3, rtol=1e-5)


def authors_epo(losses: np.ndarray, c: np.ndarray, r: np.ndarray, eps: float = 1e-2) -> tuple[float, str]:
    """The authors' EPO_LP.get_alpha(C=True, relax=True) in cvxpy (Clarabel for GLPK): the optimal value."""
    import cvxpy as cp

    m = len(losses)
    rl = r * losses
    lhat = rl / rl.sum()
    mu = float(np.sum(lhat * np.log(lhat * m)))
    a = r * (np.log(lhat * m) - mu)
    ca = c @ a
    alpha = cp.Variable(m)
    if mu > eps:
        rhs = ca.copy()
        if (ca > 0).any():
            rhs[ca > 0] = -np.inf
            rhs[rl >= 0.9 * rl.max()] = 0
        else:
            rhs = np.zeros(m)
        rows = np.isfinite(rhs)
        cons = [alpha >= 0, cp.sum(alpha) == 1] + ([c[rows] @ alpha >= rhs[rows]] if rows.any() else [])
        return cp.Problem(cp.Maximize(alpha @ ca), cons).solve(cp.CLARABEL), "balance"
    cons = [alpha >= 0, cp.sum(alpha) == 1, c @ alpha >= 0]
    return cp.Problem(cp.Maximize(cp.sum(alpha @ c)), cons).solve(cp.CLARABEL), "descent"


@pytest.mark.parametrize(("losses", "pref"), [([2.0, 0.5], [1.0, 1.0]), ([1.0, 1.001], [1.0, 1.0]),
                                              ([0.4, 1.2, 0.9], [1.0, 2.0, 1.0]), ([3.0, 0.3, 1.0, 0.7], [1.0] * 4)])
def test_epo_against_the_authors_program(losses: list[float], pref: list[float]) -> None:
    l, r = np.array(losses), np.array(pref)
    j = JACOBIANS[len(l) - 2]
    c = j @ j.T
    alpha, move = epo_alpha(l, c, r)
    value, their_move = authors_epo(l, c, r)
    assert move == their_move
    assert alpha.min() >= -1e-12 and abs(alpha.sum() - 1) < 1e-9
    rl = r * l
    lhat = rl / rl.sum()
    a = r * (np.log(lhat * len(l)) - np.sum(lhat * np.log(lhat * len(l))))
    objective = alpha @ (c @ a) if move == "balance" else (c @ alpha).sum()
    np.testing.assert_allclose(objective, value, rtol=1e-6, atol=1e-8)
    w = EPORule(preference=pref).weights(dataclasses.replace(inputs(j), losses=l))
    np.testing.assert_allclose(w, 0.8 * alpha + 0.2 / len(l), rtol=1e-12)


# ------------------------------------------------------------------------------------ the exchanges
def _slices(d_enc: int, head: int, m: int) -> TaskSlices:
    heads = tuple(torch.arange(d_enc + t * head, d_enc + (t + 1) * head) for t in range(m))
    return TaskSlices(torch.arange(d_enc), heads)


@pytest.mark.parametrize("name", ["upgrad", "dualproj", "cagrad", "imtl-g", "aligned-mtl"])
def test_an_fsmgda_exchange_round_steps_by_torchjds_aggregator(name: str) -> None:
    """The encoder step equals ``eta_g`` times torchjd's *Aggregator* (its own Gramian) of the averaged task
    updates; each head moves by its task's weight times its update."""
    import torchjd.aggregation as jd

    m, d_enc, head = 3, 6, 2
    slices = _slices(d_enc, head, m)
    deltas = torch.tensor(RNG.normal(size=(4, m, d_enc + m * head)), dtype=F64)
    for t in range(m):  # a task's trajectory moves the encoder and its own head only
        for o in range(m):
            if o != t:
                deltas[:, t, slices.heads[o]] = 0
    method = METHODS[f"fsmgda-{name}"](lr_global=2.0)
    algorithm = method.build(_Context(slices)).algorithm
    fed = ScriptedFederation(np.arange(4), [Replies(np.arange(4), deltas=deltas)])
    theta = torch.tensor(RNG.normal(size=d_enc + m * head), dtype=F64)
    step = algorithm.round(algorithm.init_state(m), theta, fed)
    mean = deltas.mean(0)
    aggregator = {"upgrad": jd.UPGrad(), "dualproj": jd.DualProj(), "cagrad": jd.CAGrad(c=0.4), "imtl-g": jd.IMTLG(),
                  "aligned-mtl": jd.AlignedMTL()}[name]
    expected = aggregator(mean[:, slices.encoder]) * (m if name == "aligned-mtl" else 1)  # the authors' sum
    torch.testing.assert_close(step.theta[slices.encoder] - theta[slices.encoder], 2.0 * expected, rtol=1e-4,
                               atol=1e-7)
    w = np.asarray(step.log["weights"])
    for t, h in enumerate(slices.heads):
        torch.testing.assert_close(step.theta[h] - theta[h], 2.0 * w[t] * mean[t, h], rtol=1e-12, atol=1e-14)
    assert step.state.round == 1 and np.array_equal(step.state.weights, w)


@pytest.mark.parametrize("m", [2, 3])
def test_a_fedmgda_plus_round_steps_along_the_box_min_norm_point_of_the_normalised_task_updates(m: int) -> None:
    """FLGo's step, ``theta += eta_g sum_i lambda_i u_i`` with ``u_i`` the averaged task updates' encoder parts
    normalised, ``lambda`` the min-norm point of the ``u_i`` within ``epsilon = 0.1`` of ``1/m`` (SLSQP here);
    each head moves by its own ``lambda_i / ||Dbar_i||`` times its update. With two tasks ``lambda = (1/2,
    1/2)`` whatever the updates (the midpoint of two unit vectors is their min-norm point)."""
    d_enc, head = 6, 2
    slices = _slices(d_enc, head, m)
    rng = np.random.default_rng(5)
    deltas = torch.tensor(rng.normal(size=(4, m, d_enc + m * head)), dtype=F64)
    deltas[:, 0] *= 50.0  # very different update norms: the normalisation matters
    if m == 3:  # tasks 0 and 1 nearly opposed: the min-norm point leaves task 2 at the box's edge
        deltas[:, 1, slices.encoder] = -0.02 * deltas[:, 0, slices.encoder] + 0.05 * deltas[:, 1, slices.encoder]
    for t in range(m):
        for o in range(m):
            if o != t:
                deltas[:, t, slices.heads[o]] = 0
    algorithm = METHODS["fedmgda-plus"](lr_global=1.5).build(_Context(slices)).algorithm
    fed = ScriptedFederation(np.arange(4), [Replies(np.arange(4), deltas=deltas)])
    theta = torch.tensor(rng.normal(size=d_enc + m * head), dtype=F64)
    step = algorithm.round(algorithm.init_state(m), theta, fed)
    mean = deltas.mean(0).numpy()
    enc = mean[:, slices.encoder.numpy()]
    norms = np.linalg.norm(enc, axis=1)
    u = enc / norms[:, None]
    res = minimize(lambda x: x @ (u @ u.T) @ x, np.full(m, 1 / m), bounds=[(1 / m - 0.1, 1 / m + 0.1)] * m,
                   method="SLSQP", constraints={"type": "eq", "fun": lambda x: 1 - x.sum()}, options={"ftol": 1e-15})
    lam = res.x
    if m == 2:
        np.testing.assert_allclose(lam, [0.5, 0.5], atol=1e-7)
    else:
        assert lam[2] == pytest.approx(1 / m - 0.1, abs=1e-6)  # the box binds
    np.testing.assert_allclose(step.theta[slices.encoder].numpy() - theta[slices.encoder].numpy(), 1.5 * lam @ u,
                               rtol=1e-5, atol=1e-9)
    for t, h in enumerate(slices.heads):
        np.testing.assert_allclose(step.theta[h].numpy() - theta[h].numpy(), 1.5 * lam[t] / norms[t] * mean[t, h.numpy()],
                                   rtol=1e-5, atol=1e-9)


class _Context:
    num_tasks, task_names, seed, benchmark = 3, ("a", "b", "c"), 0, "scripted"

    def __init__(self, slices: TaskSlices) -> None:
        self._slices = slices

    def task_slices(self) -> TaskSlices:
        return self._slices


def test_the_state_goes_through_the_plain_form_and_bad_states_are_refused() -> None:
    state = GramianState(np.array([0.7, -0.1, 0.6]), 5)
    back = GramianState.from_plain(state.to_plain())
    assert np.array_equal(back.weights, state.weights) and back.round == 5
    with pytest.raises(StateError, match="gramian weights has non-finite values"):
        GramianState.from_plain(GramianState(np.array([np.nan, 1.0]), 0).to_plain())


def test_every_gramian_method_is_registered_with_its_exchanges_rates_and_labels() -> None:
    assert len(GRAMIAN_METHODS) == 14
    for n in GRAMIAN_METHODS:
        cls = METHODS[n]
        assert cls.rates_from == ("fedcmoo" if n.startswith("fedcmoo") else "fsmgda")
        assert cls.secure_aggregation == (not n.startswith("fedcmoo"))
        assert cls.label and cls.complexity[1] == ("Θ(d)" if n.startswith("fedcmoo") else "Θ(md)")
        cfg = load_config("multimnist", [f"method='{n}'"])
        exchange = load_config("multimnist", [f"method='{cls.rates_from}'"])
        if n == "fedcmoo-pref":  # its authors' rates (askinb/FedCMOO config.py), not FedCMOO's 1.2 / 0.5
            assert (cfg.lr_global, cfg.lr_local) == (1.6, 0.3) != (exchange.lr_global, exchange.lr_local)
        else:
            assert (cfg.lr_global, cfg.lr_local) == (exchange.lr_global, exchange.lr_local)
        assert type(cfg.section(n)) is cls.section
    for setting in ("multimnist", "mnist-fmnist", "multimnist-xd", "cifar10-mnist-a", "celeba5-a"):
        cfg = load_config(setting, ["method='fedcmoo-pref'"])
        assert (cfg.lr_global, cfg.lr_local) == (1.6, 0.3), setting


@pytest.mark.parametrize(("override", "message"), [
    ("fsmgda-cagrad.c=-1.0", "fsmgda-cagrad.c = -1.0 must be >= 0"),
    ("fedcmoo-upgrad.reg_eps=-1e-3", "fedcmoo-upgrad.reg_eps = -0.001 must be >= 0"),
    ("fedcmoo-aligned-mtl.scale_mode='max'", "fedcmoo-aligned-mtl.scale_mode"),
    ("fedcmoo-pref.mix=1.5", "fedcmoo-pref.mix = 1.5 in \\[0, 1\\]"),
    ("fedcmoo-pref.preference='pareto'", "fedcmoo-pref.preference = 'pareto'"),
    ("fedcmoo-pref.preference=[1.0, -2.0]", "must be positive numbers"),
    ("fedcmoo-upgrad.estimator='exact'", "fedcmoo-upgrad.estimator"),
    ("fedmgda-plus.epsilon=-0.1", "fedmgda-plus.epsilon = -0.1"),
    ("fsmgda-upgrad.c=0.5", "c"),
])
def test_bad_hyper_parameters_are_refused_naming_the_key(override: str, message: str) -> None:
    method = override.split(".")[0]
    with pytest.raises(ConfigError, match=message):
        load_config("multimnist", [f"method='{method}'", override])


def test_a_missing_torchjd_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchjd", None)
    monkeypatch.setitem(sys.modules, "torchjd.aggregation", None)
    with pytest.raises(ConfigError, match=r"pip install 'fedhv\[gramian\]'"):
        METHODS["fsmgda-upgrad"]().build(_Context(_slices(3, 1, 3)))


# ------------------------------------------------------------------------------------ real runs
@pytest.mark.needs_data
@pytest.mark.parametrize("method", GRAMIAN_METHODS)
def test_both_engines_agree_in_float64_and_count_their_exchanges_bytes(method: str, tmp_path: Path) -> None:
    from fedhv.experiment import run_experiment
    from fedhv.results.rundir import read_jsonl

    runs = {}
    for engine in ("sequential", "batched"):
        cfg = small_config(f"method='{method}'", "dtype='float64'", f"engine='{engine}'", "rounds=2")
        run_experiment(cfg, tmp_path / engine, progress=False)
        runs[engine] = read_jsonl(tmp_path / engine / "rounds.jsonl")
    for a, b in zip(runs["sequential"], runs["batched"], strict=True):
        np.testing.assert_allclose(a["weights"], b["weights"], rtol=1e-9)
    base = "fedcmoo" if method.startswith("fedcmoo") else "fsmgda"
    run_experiment(small_config(f"method='{base}'", "dtype='float64'", "rounds=1"), tmp_path / base, progress=False)
    ref = read_jsonl(tmp_path / base / "rounds.jsonl")[0]
    got = runs["batched"][0]
    extra = 2 * 8 if method == "fedcmoo-pref" else 0  # m float64 reports in stage 1
    assert got["bytes_up_per_client"] == ref["bytes_up_per_client"] + extra
    assert (got["bytes_down_per_client"], got["sync_stages"]) == (ref["bytes_down_per_client"], ref["sync_stages"])


@pytest.mark.needs_data
@pytest.mark.parametrize("method", GRAMIAN_METHODS)
def test_resume_equals_the_uninterrupted_run(method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = small_config(f"method='{method}'", "rounds=4", "checkpoint.period=1")
    assert_resume_is_bit_identical(cfg, tmp_path, monkeypatch)
