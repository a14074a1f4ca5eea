"""Inverse-slack (log-hypervolume) weight map of FedHV (paper §3.3, A.6).

For objective estimates ``z`` and a reference ``r``::

    s_i = max(r_i - z_i, rho_clip),    [W(z; r)]_i = s_i^{-1} / sum_j s_j^{-1}.

``W`` is the normalised gradient weighting of the log-hypervolume
``Phi = -sum_i log(r_i - f_i)`` (Miranda & Von Zuben, 2016): objectives with a
smaller slack to the reference get larger weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HVWeights:
    """Result of the weight map.

    Attributes
    ----------
    weights : ndarray ``[m]``
        On the probability simplex.
    raw_slack : ndarray ``[m]``
        ``r - z`` before the floor.
    floor_active : ndarray, bool ``[m]``
        Where ``r_i - z_i < rho_clip`` (the floor replaced the slack).
    """

    weights: np.ndarray
    raw_slack: np.ndarray
    floor_active: np.ndarray


def hv_weights(z: np.ndarray, reference: np.ndarray, rho_clip: float = 1e-6) -> HVWeights:
    """Apply ``W_{rho_clip}(z; r)``.

    Parameters
    ----------
    z : array ``[m]``
        Averaged objective reports.
    reference : array ``[m]``
        Training reference ``r``.
    rho_clip : float
        Slack floor, ``> 0``.

    Examples
    --------
    >>> hv_weights(np.array([1.0, 2.0]), np.array([3.0, 3.0])).weights
    array([0.33333333, 0.66666667])
    """
    if not rho_clip > 0:
        raise ValueError(f"rho_clip = {rho_clip} must be > 0")
    z = np.asarray(z, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if z.shape != r.shape:
        raise ValueError(f"reports have shape {z.shape} but the reference has shape {r.shape}")
    raw = r - z
    active = raw < rho_clip
    inv = 1.0 / np.maximum(raw, rho_clip)
    return HVWeights(inv / inv.sum(), raw, active)
