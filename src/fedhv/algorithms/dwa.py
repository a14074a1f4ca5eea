"""DWA, dynamic weight average (Liu, Johns and Davison, CVPR 2019).

"End-to-End Multi-Task Learning with Attention".

From the averaged reports, with ``Fbar^t`` the mean report over the last ``window`` rounds up to round
``t`` (``window = 1``: ``Fbar^t = F^t``)::

    rho_i = Fbar_i^t / Fbar_i^{t - window},      w^{t+1} = softmax(rho / T),

uniform until two windows of reports exist. The authors' code (``lorenmt/mtan``, and LibMTL's
``weighting/DWA.py``) uses the mean loss of the last two *epochs* and weights ``m softmax(rho / T)``
that sum to ``m``; here the weights sum to 1 as in every fedhv method (the authors' scale is a factor
``m`` on the learning rates), and a round's averaged report plays the epoch's mean loss, optionally
averaged over ``window`` rounds. (FAMO's repository also runs DWA on windows, of 25 batches, starting
from a buffer of ones once the first window is full; here the ratio waits for two windows of real
reports.) Federated,
consecutive reports come from different client cohorts, so ``rho`` also carries the cohorts'
difference; a window evens it out. FedHV's loss-only protocol (:mod:`fedhv.algorithms.loss_only`).
Defaults: ``T = 2`` (the authors'), ``window = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, softmax, uniform
from fedhv.algorithms.method import BuildContext, positive, register
from fedhv.algorithms.plain import StateError
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.config.validation import at_least, at_most
from fedhv.errors import ConfigError

#: Bounds on ``dwa.temperature`` and ``dwa.window`` (issue 52). The softmax reads ``ratio / T`` with loss ratios
#: near 1, so ``T = 1e-3`` (500 times below ``fedhv tune``'s smallest, 0.5) already gives one task all the
#: weight; ``1e-320`` overflowed it to NaN weights. The memory holds ``2 window`` reports: a million rounds.
MIN_TEMPERATURE = 1e-3
MAX_WINDOW = 1_000_000


@dataclass(frozen=True)
class DWAConfig:
    """The ``[dwa]`` section.

    Attributes
    ----------
    temperature : float
        ``T > 0`` of the softmax (the authors': 2).
    window : int
        Rounds whose reports are averaged into ``Fbar`` (``>= 1``).
    report_batches : int or "all"
        The clients' report budget.
    """

    temperature: float = 2.0
    window: int = 1
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive temperature or window, or a bad report budget."""
        positive("dwa.temperature", self.temperature, "e.g. 2.0 (the authors')")
        at_least("dwa.temperature", self.temperature, MIN_TEMPERATURE,
                 "at 1e-3 a loss ratio 0.01 apart is already a weight factor e^10; e.g. 2.0 (the authors')")
        if self.window < 1:
            raise ConfigError(f"dwa.window = {self.window} must be >= 1 (1: the last round's report alone)")
        at_most("dwa.window", self.window, MAX_WINDOW, "the rule keeps 2 x window reports; e.g. 1 or 5")
        check_report_batches("dwa.report_batches", self.report_batches)


@dataclass(frozen=True)
class DynamicWeightAverage:
    """DWA's rule; its memory holds the last ``2 window`` averaged reports, oldest first."""

    temperature: float = 2.0
    window: int = 1

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m``, nothing remembered."""
        return uniform(num_tasks), ()

    def check_memory(self, memory: tuple[np.ndarray, ...], num_tasks: int) -> None:
        """Refuse a (resumed) memory of more than ``2 window`` reports or a report of another length than ``m``."""
        if len(memory) > 2 * self.window:
            raise StateError(f"dwa memory holds {len(memory)} reports; dwa.window = {self.window} keeps at most "
                             f"{2 * self.window}")
        shapes = [list(np.shape(a)) for a in memory]
        if any(s != [num_tasks] for s in shapes):
            raise StateError(f"dwa memory has reports of shapes {shapes}; each holds the {num_tasks} tasks' losses")

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``softmax(rho / T)`` once ``2 window`` reports exist, else ``1/m``."""
        kept = (*memory, np.asarray(report, dtype=np.float64))[-2 * self.window:]
        if len(kept) < 2 * self.window:
            return uniform(len(report)), kept
        older = np.mean(kept[: self.window], axis=0)
        recent = np.mean(kept[self.window:], axis=0)
        return softmax((recent / older) / self.temperature), kept


@register
@dataclass(frozen=True)
class DWA(LossOnlyMethod):
    """Dynamic weight average; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: DWAConfig = field(default_factory=DWAConfig)
    name: ClassVar[str] = "dwa"
    label: ClassVar[str] = "DWA"
    section: ClassVar[type] = DWAConfig
    #: ``fedhv tune`` searches the temperature T (Liu et al.: T = 2).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("temperature", 0.5, 10.0, log=True, authors=(2.0,)),)
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "loss ratios of two windows, softmax")

    def rule(self, context: BuildContext) -> DynamicWeightAverage:
        """The rule with the configured temperature and window."""
        return DynamicWeightAverage(self.config.temperature, self.config.window)
