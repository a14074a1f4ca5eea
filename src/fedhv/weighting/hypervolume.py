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


def hv_weights(z: np.ndarray, reference: np.ndarray, rho_clip: float = 1e-6,
               slack_scale: np.ndarray | None = None) -> HVWeights:
    """Apply ``W_{rho_clip}(z; r)``.

    With ``slack_scale = d`` (fedhv's opt-in scale-free variant, not the paper's map) the
    slack is measured in units of ``d_i`` before the floor::

        s_i = max((r_i - z_i) / d_i, rho_clip),    w_i = s_i^{-1} / sum_j s_j^{-1},

    so a task whose loss lives on a larger scale (a 10-class cross-entropy next to a binary
    one) is not down-weighted for that alone. ``raw_slack`` stays ``r - z``.

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
    slack = raw if slack_scale is None else raw / np.asarray(slack_scale, dtype=np.float64)
    active = slack < rho_clip
    inv = 1.0 / np.maximum(slack, rho_clip)
    return HVWeights(inv / inv.sum(), raw, active)
