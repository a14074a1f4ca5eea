"""FedHV: hypervolume weighting from objective reports (paper §3.3, Appendix E).

Round ``t`` (server holds ``theta^t`` and ``w^t``; ``w^0 = 1/m``):

1. broadcast ``(theta^t, w^t)`` to the sampled clients ``S_t``;
2. client ``k`` reports ``F_k^t`` = its ``m`` task losses at ``theta^t`` (eval mode,
   over ``B_rep`` minibatches or its whole local dataset), then runs ``K`` local SGD
   steps on ``sum_i w_i^t l_i`` and returns ``(Delta theta_k^t, F_k^t)``;
3. ``theta^{t+1} = theta^t + eta_g mean_k Delta theta_k^t``,
   ``F^t = mean_k F_k^t``, ``w^{t+1} = W_{rho_clip}(F^t; r)``.

The weights are one round stale by design: reports collected in round ``t``
determine the weights of round ``t + 1``. The protocol adds exactly ``2m`` scalars
per participating client (``m`` weights down, ``m`` reports up).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from fedhv.algorithms.base import Federation, Request, StepResult, fedavg_step
from fedhv.algorithms.plain import StateError, array_from_plain, array_to_plain, fields
from fedhv.weighting import hv_weights


@dataclass(frozen=True)
class FedHVState:
    """Mutable-by-replacement FedHV server state.

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``w^t`` for the coming round.
    last_report : ndarray ``[m]`` or None
        ``F^{t-1}``, the last averaged report.
    """

    weights: np.ndarray
    last_report: np.ndarray | None = None
    kind: ClassVar[str] = "fedhv"

    @property
    def num_tasks(self) -> int:
        return len(self.weights)

    def to_plain(self) -> dict[str, Any]:
        """``{"weights": Tensor [m], "last_report": Tensor [m] or None}`` (same dtypes)."""
        return {"weights": array_to_plain(self.weights), "last_report": array_to_plain(self.last_report)}

    @classmethod
    def from_plain(cls, data: Any) -> FedHVState:
        """Inverse of :meth:`to_plain`; weights must lie on the simplex, reports be finite."""
        d = fields(data, cls.kind, ("weights", "last_report"))
        weights = array_from_plain(d["weights"], "fedhv weights")
        report = array_from_plain(d["last_report"], "fedhv last_report", optional=True)
        assert weights is not None
        if (weights < 0).any() or abs(float(weights.sum()) - 1.0) > 1e-6:
            raise StateError(f"fedhv weights {weights.tolist()} are not on the simplex (>= 0, sum 1)")
        if report is not None and len(report) != len(weights):
            raise StateError(f"fedhv last_report has {len(report)} values for {len(weights)} weights")
        return cls(weights, report)


@dataclass(frozen=True)
class FedHV:
    """FedHV with a fixed training reference.

    Parameters
    ----------
    reference : ndarray ``[m]``
        Training reference ``r`` (from calibration or given).
    lr_global : float
        Server learning rate ``eta_g``.
    rho_clip : float
        Slack floor of the weight map (paper: 1e-6).
    report_batches : int or "all"
        Report budget ``B_rep`` (paper default: all).
    slack_scale : ndarray ``[m]`` or None
        Opt-in scale-free variant: slacks in units of ``slack_scale`` (e.g. each task's
        calibrated range ``r_i - min_t F_i^t``; :func:`fedhv.weighting.hv_weights`). ``None``
        is the paper's map.
    """

    reference: np.ndarray
    lr_global: float
    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    name: str = "fedhv"
    slack_scale: np.ndarray | None = None

    def init_state(self, num_tasks: int) -> FedHVState:
        if len(self.reference) != num_tasks:
            raise ValueError(f"reference has {len(self.reference)} entries for {num_tasks} tasks")
        return FedHVState(weights=np.full(num_tasks, 1.0 / num_tasks))

    def round(self, state: FedHVState, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One FedHV round: a single stage (model + ``w`` down, update + report up)."""
        weights = np.asarray(state.weights, dtype=np.float32)
        replies = federation.exchange(
            theta, Request(payload={"weights": weights}, report=self.report_batches, train=state.weights[None, :])
        )
        assert replies.reports is not None and replies.deltas is not None
        new_theta = fedavg_step(theta, replies.deltas[:, 0], self.lr_global, replies.weights)
        report = replies.reports.double().mean(0).cpu().numpy()
        hv = hv_weights(report, self.reference, self.rho_clip, self.slack_scale)
        log = {
            "weights": state.weights.tolist(),
            "report": report.tolist(),
            "min_slack": float(hv.raw_slack.min()),
            "floor_activations": int(hv.floor_active.sum()),
            "next_weights": hv.weights.tolist(),
        }
        return StepResult(new_theta, replace(state, weights=hv.weights, last_report=report), log)
