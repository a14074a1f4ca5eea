"""The built-in methods.

Re-exported from their modules in :mod:`fedhv.algorithms`, where each method's
hyper-parameters, round logic, configuration section and registration live together.

``FedHV``: ``w^{t+1}_i ∝ 1 / max(r_i - F_i^t, rho_clip)`` from averaged client reports ``F^t``;
``Uniform``: ``w = 1/m``; ``FSMGDA`` / ``FedCMOO``: min-norm weights of client gradients. All:
``theta^{t+1} = theta^t + eta_g mean_k Delta_k``.
"""

from __future__ import annotations

from fedhv.algorithms.fedcmoo import FedCMOO
from fedhv.algorithms.fedhv import FedHV, calibrated_range, slack_scale_values
from fedhv.algorithms.fsmgda import FSMGDA
from fedhv.algorithms.method import Method
from fedhv.algorithms.uniform import Uniform

__all__ = ["FSMGDA", "FedCMOO", "FedHV", "Method", "Uniform", "calibrated_range", "slack_scale_values"]
