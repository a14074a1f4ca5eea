"""The loss-only methods' weight rules inside a Strategy: what a rule may ask of its run, in Flower.

A loss-only method (:class:`fedhv.algorithms.loss_only.LossOnlyMethod`: DWA, FAMO, RLW, STCH, inverse
loss, linear scalarisation, or a user's own) is its weight rule alone, a map from the averaged reports to
the next weights; :class:`~fedhv.flower.strategy_weighting.FedHVWeighting` runs it where it runs FedHV's
map, on the same single message exchange per round. :meth:`LossOnlyMethod.rule` builds the rule from a
:class:`~fedhv.algorithms.method.BuildContext`; a Strategy has no model split or data of its own, so
:class:`StrategyContext` provides the task count, the seed (RLW's draws) and, for a method that
``uses_calibration()`` (STCH's nadir), the Strategy's own calibration rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod
from fedhv.errors import ConfigError
from fedhv.registry import METHODS

__all__ = ["StrategyCalibration", "StrategyContext", "loss_only_method"]


@dataclass(frozen=True)
class StrategyCalibration:
    """A Strategy's calibration (:class:`fedhv.algorithms.method.Calibration`): ``r``, its parts and the reports."""

    reference: list[float]
    reports: dict[str, list[list[float]]]
    max_report: list[float]
    margin: float


@dataclass(frozen=True)
class StrategyContext:
    """What a loss-only rule may ask of a Strategy (:class:`fedhv.algorithms.method.BuildContext`)."""

    num_tasks: int
    seed: int = 0
    given_calibration: StrategyCalibration | None = None
    task_names: tuple[str, ...] = field(default=())
    benchmark: str = "the Strategy's tasks"

    def __post_init__(self) -> None:
        if not self.task_names:
            object.__setattr__(self, "task_names", tuple(f"task {i}" for i in range(self.num_tasks)))

    def task_slices(self) -> Any:
        """Not available: a Strategy sees arrays, not a model split into encoder and heads."""
        raise ConfigError("a Strategy has no encoder / head split; a loss-only rule must not ask for task_slices()")

    def calibration(self) -> StrategyCalibration:
        """The Strategy's calibration (run before the rule is built)."""
        if self.given_calibration is None:
            raise ConfigError("this method needs a calibration: give the Strategy calibration_rounds >= 1")
        return self.given_calibration

    def initial_losses(self) -> np.ndarray:
        """Not available: the Strategy holds no data."""
        raise ConfigError("a Strategy holds no data; a loss-only rule must not ask for initial_losses()")


def loss_only_method(weighting: Any) -> LossOnlyMethod:
    """The loss-only method a Strategy's ``weighting`` names (a registered name or a method object)."""
    if isinstance(weighting, str):
        if weighting not in METHODS:
            raise ConfigError(f"weighting = {weighting!r}: use 'fedhv', 'uniform' or a loss-only method "
                              f"({', '.join(loss_only_names())})")
        weighting = METHODS[weighting]()
    if not isinstance(weighting, LossOnlyMethod):
        raise ConfigError(f"weighting = {weighting!r} is not a loss-only method: a Strategy runs one exchange per "
                          f"round (the report and one trajectory); use one of {', '.join(loss_only_names())}, or "
                          "fedhv's ServerApp for the gradient-geometry methods")
    return weighting


def loss_only_names() -> list[str]:
    """The registered loss-only methods' names."""
    return sorted(n for n in METHODS.names() if isinstance(METHODS[n], type) and issubclass(METHODS[n], LossOnlyMethod))
