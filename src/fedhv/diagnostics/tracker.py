"""Per-run diagnostics state: what a run records at its evaluations and the round after.

At a test evaluation after round ``t`` (model ``theta^t``) :meth:`Diagnostics.evaluate` adds a
``"diagnostics"`` object to that ``metrics.jsonl`` entry: the full-population objective
``f(theta^t)``, the per-client fairness summaries, and the log-HV quantities
(:mod:`fedhv.diagnostics.theory`) with their running values over the evaluations so far
(``grad_phi_sq_avg``: the mean of ``||grad Phi||^2`` over the evaluated models, the sampled
stand-in for Theorem 4.1's average over all rounds; ``phi_max`` and ``slack_bound_run``).

The next round starts from ``theta^t``: its record carries the weights ``w^t`` it trained with
and, for a method with objective reports, the averaged report ``F^t`` measured at ``theta^t``.
:meth:`Diagnostics.after_round` then adds to that ``rounds.jsonl`` record::

    report_error       = ||F^t - f(theta^t)||_inf          (paper A.7's Xi_loss, one sample)
    stale_weight_error = ||w^t - W(f(theta^t); r)||_1      (paper A.8: the weights the true
                                                            objective would give at theta^t)

with ``W`` the paper's inverse-slack map (``rho_clip`` of the run). A method without
reports (Uniform) gets ``report_error = None``; its ``stale_weight_error`` is the distance of
its own weights from the hypervolume weights at that model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv.config.schema import DiagnosticsConfig
from fedhv.data.federated import FederatedData
from fedhv.diagnostics.clients import client_fairness, client_means, population_objective
from fedhv.diagnostics.theory import draw_probe, loghv_quantities, slack_bound, task_gradients
from fedhv.objectives import nonnegative_losses
from fedhv.weighting import hv_weights


@dataclass
class Diagnostics:
    """Diagnostics of one run (see the module docstring).

    Parameters
    ----------
    config : DiagnosticsConfig
    data : FederatedData
    reference : sequence of float
        The training reference ``r`` (FedHV's, or a calibration's for another method).
    rho_clip : float
        Floor of the weight map ``W`` for ``stale_weight_error``.
    batch_size : int
        Samples per forward pass of the per-client evaluation.
    """

    config: DiagnosticsConfig
    data: FederatedData
    reference: Sequence[float]
    rho_clip: float = 1e-6
    batch_size: int = 2500
    evaluations: int = 0
    grad_phi_sq_sum: float = 0.0
    grad_phi_sq_count: int = 0
    phi_max: float | None = None
    seconds: float = 0.0
    pending: tuple[int, np.ndarray] | None = None
    probe: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.probe = draw_probe(self.data.parts, self.config.probe_samples, self.config.probe_seed)

    def due(self) -> bool:
        """Whether the coming test evaluation is one of every ``period``-th."""
        return self.evaluations % self.config.period == 0

    def population(self, model: nn.Module) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(f(theta), per-client losses, per-client scores)`` of ``model``."""
        loss, score, _ = client_means(model, self.data, self.batch_size)
        return population_objective(loss), loss, score

    def evaluate(self, round_done: int, model: nn.Module, last: bool = False) -> dict[str, Any] | None:
        """The ``"diagnostics"`` object of the evaluation after ``round_done`` (``None`` when not due:
        every ``period``-th evaluation and the run's ``last`` one are).

        ``model`` holds ``theta^t`` and the run's buffers; it is left in eval mode.
        """
        due = self.due() or last
        self.evaluations += 1
        if not due:
            return None
        t0 = time.perf_counter()
        f, loss, score = self.population(model)
        self.pending = (round_done, f)
        grads, probe_loss = task_gradients(model, self.data.train_x, self.data.train_y, self.data.objective,
                                           self.probe)
        gram = (grads @ grads.T).cpu().numpy()
        ref = np.asarray(self.reference, dtype=np.float64)
        q = loghv_quantities(gram, f, ref)
        # the slack bound takes S = r as the slacks' upper bound, which needs losses >= 0: none for a signed task
        signed = not all(nonnegative_losses(self.data.objective, len(ref)))
        if signed:
            q["slack_bound"] = None
        if q["grad_phi_sq"] is not None:
            self.grad_phi_sq_sum += q["grad_phi_sq"]
            self.grad_phi_sq_count += 1
        if q["phi"] is not None:
            self.phi_max = q["phi"] if self.phi_max is None else max(self.phi_max, q["phi"])
        model.eval()
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        return {
            "objective": f.tolist(),
            "probe_loss": probe_loss.tolist(),
            **q,
            "grad_phi_sq_avg": self.grad_phi_sq_sum / self.grad_phi_sq_count if self.grad_phi_sq_count else None,
            "phi_max": self.phi_max,
            "slack_bound_run": None if self.phi_max is None or signed else slack_bound(self.phi_max, ref),
            "clients": client_fairness(loss, score, self.data.objective),
            "probe_samples": len(self.probe),
            "seconds": seconds,
        }

    def after_round(self, round_done: int, log: dict[str, Any]) -> dict[str, Any] | None:
        """The report and stale-weight errors of round ``round_done`` when it started from an evaluated model."""
        if self.pending is None or self.pending[0] != round_done - 1:
            return None
        _, f = self.pending
        self.pending = None
        ref = np.asarray(self.reference, dtype=np.float64)
        out: dict[str, Any] = {"at_round": round_done - 1}
        report = log.get("report")
        out["report_error"] = None if report is None else float(np.max(np.abs(np.asarray(report) - f)))
        weights = log.get("weights")
        ideal = hv_weights(f, ref, self.rho_clip).weights
        out["ideal_weights"] = ideal.tolist()
        out["stale_weight_error"] = None if weights is None else float(np.abs(np.asarray(weights) - ideal).sum())
        return out

    def restore(self, entries: Sequence[dict[str, Any]], round_done: int, model: nn.Module | None) -> None:
        """Running values from the kept ``metrics.jsonl`` entries of a resumed run, and the pending
        objective when the run stopped right after an evaluation with diagnostics (``model`` holds it)."""
        self.evaluations = len(entries)
        for entry in entries:
            d = entry.get("diagnostics") or {}
            self.seconds += float(d.get("seconds") or 0.0)
            if d.get("grad_phi_sq") is not None:
                self.grad_phi_sq_sum += float(d["grad_phi_sq"])
                self.grad_phi_sq_count += 1
            if d.get("phi") is not None:
                self.phi_max = float(d["phi"]) if self.phi_max is None else max(self.phi_max, float(d["phi"]))
        last = entries[-1] if entries else None
        if last is not None and last.get("round") == round_done and last.get("diagnostics") and model is not None:
            with torch.no_grad():
                f, _, _ = self.population(model)
            self.pending = (round_done, f)
