"""Linear scalarisation with given task weights: ``w = u / sum(u)`` in every round.

Uniform generalised to a preference vector: the clients train on ``sum_i w_i l_i`` with fixed ``w``.
It runs FedHV's loss-only protocol (:mod:`fedhv.algorithms.loss_only`; the reports are collected and
logged, so its runs are compared with FedHV's on the same accounting, ``Theta(d + m)`` per client).
Default ``weights = "uniform"`` (``1/m``: Uniform's trajectory, with reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, memoryless, normalized, uniform
from fedhv.algorithms.method import BuildContext, register
from fedhv.errors import ConfigError


@dataclass(frozen=True)
class LinearConfig:
    """The ``[linear]`` section.

    Attributes
    ----------
    weights : "uniform" or list of float
        The preference ``u`` (one positive number per task; normalised to sum 1), or ``1/m``.
    report_batches : int or "all"
        The clients' report budget (FedHV's default: the whole local dataset).
    """

    weights: str | tuple[float, ...] = "uniform"
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a preference that is not ``"uniform"`` or positive finite numbers."""
        check_report_batches("linear.report_batches", self.report_batches)
        if isinstance(self.weights, str):
            if self.weights != "uniform":
                raise ConfigError(f"linear.weights = {self.weights!r}: use \"uniform\" or one positive number per "
                                  "task, e.g. [2.0, 1.0]")
        elif not self.weights or not all(math.isfinite(v) and v > 0 for v in self.weights):
            raise ConfigError(f"linear.weights = {list(self.weights)} must be positive finite numbers, one per task")


@dataclass(frozen=True)
class FixedWeights:
    """The rule of linear scalarisation: the same weights in every round."""

    weights: np.ndarray
    check_memory = memoryless

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The given weights."""
        return self.weights.copy(), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The given weights again."""
        return self.weights.copy(), memory


@register
@dataclass(frozen=True)
class Linear(LossOnlyMethod):
    """Linear scalarisation ``w ∝ u``; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: LinearConfig = field(default_factory=LinearConfig)
    name: ClassVar[str] = "linear"
    label: ClassVar[str] = "Linear"
    section: ClassVar[type] = LinearConfig
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "none beyond model aggregation")

    @classmethod
    def front_overrides(cls, direction: tuple[float, ...], margin: float | None = None) -> tuple[str, ...] | None:
        """Aim at the loss-space direction ``u`` with ``w ∝ 1/u``.

        These are the weights FedHV's map tends to as its reference ``r = c u`` moves away (``c -> inf``),
        so both trace the front over the same directions.
        """
        inv = 1.0 / np.asarray(direction, dtype=np.float64)
        return (f"linear.weights={(inv / inv.sum()).tolist()!r}",)

    def rule(self, context: BuildContext) -> FixedWeights:
        """The normalised preference, checked against the task count."""
        m = context.num_tasks
        if isinstance(self.config.weights, str):
            return FixedWeights(uniform(m))
        if len(self.config.weights) != m:
            raise ConfigError(f"linear.weights has {len(self.config.weights)} values but {context.benchmark} has "
                              f"{m} tasks ({', '.join(context.task_names)}); give one per task")
        return FixedWeights(normalized(np.asarray(self.config.weights, dtype=np.float64)))
