"""Minimum-norm point in the convex hull of task vectors (MGDA; Désidéri 2012,
Sener & Koltun 2018).

Given the Gram matrix ``G = V V^T`` of ``m`` task vectors ``v_i``, find

    lambda* = argmin_{lambda in simplex} lambda^T G lambda = || sum_i lambda_i v_i ||^2.

``m = 2`` has the closed form ``gamma = (G22 - G12) / (G11 + G22 - 2 G12)`` (weight on
``v_1``), clipped to ``[0, 1]``. The reference code (Sener & Koltun's MinNormSolver as
used by FedCMOO's FSMGDA) instead returns ``0.999`` when ``G12 >= G11`` and ``0.001``
when ``G12 >= G22``; ``reference_clip=True`` reproduces that.

For ``m >= 3``: projected gradient steps with an exact line search (the objective is
quadratic), from the uniform point, stopping when ``||Delta lambda||_1 < tol`` or after
``max_iter`` iterations (the reference solver has no working iteration cap,
isl-org/MultiObjectiveOptimization#39).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhv.weighting.simplex import project_simplex


@dataclass(frozen=True)
class MinNormResult:
    """Weights on the simplex, the squared norm ``lambda^T G lambda`` and iterations used."""

    weights: np.ndarray
    norm_sq: float
    iterations: int


def _check_gram(gram: np.ndarray) -> np.ndarray:
    g = np.asarray(gram, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] == 0:
        raise ValueError(f"Gram matrix must be square and non-empty, got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError("Gram matrix has non-finite entries")
    return 0.5 * (g + g.T)


def min_norm_two(gram: np.ndarray, reference_clip: bool = False) -> np.ndarray:
    """Closed-form min-norm weights for two vectors."""
    g = _check_gram(gram)
    a, b, c = g[0, 0], g[0, 1], g[1, 1]
    if reference_clip:
        if b >= a:
            gamma = 0.999
        elif b >= c:
            gamma = 0.001
        else:
            gamma = (c - b) / (a + c - 2 * b)
    else:
        denom = a + c - 2 * b
        gamma = 0.5 if denom <= 0 else float(np.clip((c - b) / denom, 0.0, 1.0))
    return np.array([gamma, 1.0 - gamma])


def min_norm(gram: np.ndarray, max_iter: int = 1000, tol: float = 1e-10, reference_clip: bool = False) -> MinNormResult:
    """Min-norm convex combination from a Gram matrix (any ``m``).

    Parameters
    ----------
    gram : array ``[m, m]``
        ``G_ij = <v_i, v_j>`` (symmetrised internally).
    max_iter : int
        Iteration cap of the projected-gradient solver (``m >= 3``).
    tol : float
        Stop when the ``l1`` change of ``lambda`` is below ``tol``.
    reference_clip : bool
        ``m = 2`` only: the reference code's ``[0.001, 0.999]`` boundary values.
    """
    g = _check_gram(gram)
    m = g.shape[0]
    if m == 1:
        return MinNormResult(np.ones(1), float(g[0, 0]), 0)
    if m == 2:
        w = min_norm_two(g, reference_clip)
        return MinNormResult(w, float(w @ g @ w), 0)
    lam = np.full(m, 1.0 / m)
    trace = float(np.trace(g))
    if trace <= 0:  # all vectors are zero: every point is optimal
        return MinNormResult(lam, 0.0, 0)
    step = 1.0 / (2.0 * trace)  # <= 1/L with L = 2 lambda_max(G) <= 2 trace(G)
    it = 0
    for it in range(1, max_iter + 1):
        d = project_simplex(lam - step * 2.0 * (g @ lam)) - lam
        curv = float(d @ g @ d)
        slope = float(lam @ g @ d)
        tau = 1.0 if curv <= 0 else float(np.clip(-slope / curv, 0.0, 1.0))
        lam = lam + tau * d
        if tau * float(np.abs(d).sum()) < tol:
            break
    lam = project_simplex(lam)
    return MinNormResult(lam, float(lam @ g @ lam), it)
