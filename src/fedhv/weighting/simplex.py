"""Euclidean projection onto the probability simplex (Duchi et al., ICML 2008)."""

from __future__ import annotations

import numpy as np


def project_simplex(v: np.ndarray) -> np.ndarray:
    """``argmin_{w in simplex} ||w - v||_2``.

    Sort ``u = sort(v)`` descending, ``rho = max{j : u_j - (sum_{i<=j} u_i - 1)/j > 0}``,
    ``tau = (sum_{i<=rho} u_i - 1)/rho``, ``w = max(v - tau, 0)``.

    Examples
    --------
    >>> project_simplex(np.array([0.8, 0.6]))
    array([0.6, 0.4])
    """
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"expected a non-empty vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"cannot project non-finite values {v}")
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    j = np.arange(1, len(v) + 1)
    rho = np.nonzero(u - css / j > 0)[0][-1]
    tau = css[rho] / (rho + 1)
    return np.maximum(v - tau, 0.0)
