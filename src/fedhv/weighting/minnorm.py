"""Minimum-norm point in the convex hull of task vectors (MGDA; Désidéri 2012,
Sener & Koltun 2018).

Given the Gram matrix ``G = V V^T`` of ``m`` task vectors ``v_i``, find

    lambda* = argmin_{lambda in simplex} lambda^T G lambda = || sum_i lambda_i v_i ||^2.

``m = 2`` has the closed form ``gamma = (G22 - G12) / (G11 + G22 - 2 G12)`` (weight on
``v_1``), clipped to ``[0, 1]``. The reference code (Sener & Koltun's MinNormSolver as
used by FedCMOO's FSMGDA) instead returns ``0.999`` when ``G12 >= G11`` and ``0.001``
when ``G12 >= G22``; ``reference_clip=True`` reproduces that.

For ``m >= 3``: Wolfe's minimum-norm-point algorithm (Wolfe, 1976) on the Gram matrix,
an active-set method that terminates finitely: grow a "corral" of vertices by the most
descending one, move to the affine minimiser of the corral, and drop vertices whose
weights would turn negative. It stops when no vertex improves the current point by
more than ``tol`` (relative to ``max_ij |G_ij|``) or after ``max_iter`` major
iterations (the reference solver has no working iteration cap,
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
    # The solver runs on G / max|G_ij|: the bordered affine systems in ``_affine_minimizer``
    # are then equally conditioned whatever the gradients' scale, so the weights are
    # scale-invariant (min-norm weights of c * G equal those of G for any c > 0).
    scale = float(np.abs(g).max())
    unit = g / scale if scale > 0 else g
    lam, it = _wolfe(unit, max_iter, tol)
    lam = project_simplex(lam)
    return MinNormResult(lam, float(lam @ g @ lam), it)


def _affine_minimizer(g: np.ndarray, corral: list[int]) -> np.ndarray:
    """Weights (summing to 1) of the min-norm point of the affine hull of ``corral``."""
    k = len(corral)
    a = np.zeros((k + 1, k + 1))
    a[:k, :k] = g[np.ix_(corral, corral)]
    a[:k, k] = 1.0
    a[k, :k] = 1.0
    rhs = np.zeros(k + 1)
    rhs[k] = 1.0
    sol = np.linalg.lstsq(a, rhs, rcond=None)[0][:k]
    return sol / sol.sum() if abs(sol.sum()) > 1e-300 else np.full(k, 1.0 / k)


def _wolfe(g: np.ndarray, max_iter: int, tol: float) -> tuple[np.ndarray, int]:
    m = g.shape[0]
    scale = max(float(np.abs(g).max()), 1e-300)
    start = int(np.argmin(np.diag(g)))
    lam = np.zeros(m)
    lam[start] = 1.0
    corral = [start]
    it = 0
    for it in range(1, max_iter + 1):
        grad = g @ lam
        value = float(lam @ grad)
        j = int(np.argmin(grad))
        if value - grad[j] <= tol * scale or j in corral:
            break
        corral.append(j)
        for _ in range(m + 1):  # minor cycles: at most one removal per cycle
            alpha = _affine_minimizer(g, corral)
            if np.all(alpha > 1e-15):
                lam = np.zeros(m)
                lam[corral] = alpha
                break
            cur = lam[corral]
            neg = alpha <= 1e-15
            theta = float(np.min(cur[neg] / (cur[neg] - alpha[neg])))
            new = cur + theta * (alpha - cur)
            lam = np.zeros(m)
            lam[corral] = np.clip(new, 0.0, None)
            corral = [c for c, v in zip(corral, new) if v > 1e-15]
            lam /= lam.sum()
    return lam, it
