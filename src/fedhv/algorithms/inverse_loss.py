"""Inverse-loss weighting: ``w^{t+1}_i ∝ 1 / max(F_i^t, rho)``.

The fixed point shared by uncertainty weighting (Kendall et al., CVPR 2018: at the optimum of its
``sigma_i``, ``1 / (2 sigma_i^2) = 1 / (2 l_i)``), IMTL-L (Liu et al., ICLR 2021), the geometric loss
strategy (Chennupati et al., CVPR-W 2019: the gradient of ``log prod_i l_i`` is ``sum_i grad l_i / l_i``)
and log-loss scalarisation; and FedHV's map with the reference ``r -> 0`` (``1 / (r_i - F_i)`` with
``r = 0`` is ``1 / |F_i|``): the ablation that isolates FedHV's reference. FedHV's loss-only protocol
(:mod:`fedhv.algorithms.loss_only`); ``w^0 = 1/m``. Default ``rho = 1e-6`` (FedHV's ``rho_clip``):
the floor that keeps a vanishing loss from taking all the weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, memoryless, normalized, uniform
from fedhv.algorithms.method import BuildContext, positive, register
from fedhv.config.validation import MIN_FLOOR, at_least


@dataclass(frozen=True)
class InverseLossConfig:
    """The ``[inverse-loss]`` section.

    Attributes
    ----------
    rho : float
        The floor ``rho > 0`` under the averaged report.
    report_batches : int or "all"
        The clients' report budget.
    """

    rho: float = 1e-6
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive floor or a bad report budget."""
        positive("inverse-loss.rho", self.rho, "the floor must be positive, e.g. 1e-6")
        at_least("inverse-loss.rho", self.rho, MIN_FLOOR, "1 / rho must stay finite; e.g. 1e-6 (FedHV's floor)")
        check_report_batches("inverse-loss.report_batches", self.report_batches)


@dataclass(frozen=True)
class InverseLossRule:
    """``w ∝ 1 / max(F, rho)``."""

    rho: float
    check_memory = memoryless

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m``."""
        return uniform(num_tasks), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The normalised inverse of the floored report."""
        return normalized(1.0 / np.maximum(report, self.rho)), memory


@register
@dataclass(frozen=True)
class InverseLoss(LossOnlyMethod):
    """Inverse-loss weighting; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: InverseLossConfig = field(default_factory=InverseLossConfig)
    name: ClassVar[str] = "inverse-loss"
    label: ClassVar[str] = "Inverse loss"
    section: ClassVar[type] = InverseLossConfig
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "O(Mm) report aggregation, 1 / loss")

    def rule(self, context: BuildContext) -> InverseLossRule:
        """The rule with the configured floor."""
        return InverseLossRule(self.config.rho)
