"""RLW, random loss weighting (Lin et al., "Reasonable Effectiveness of Random Weighting", TMLR 2022).

Each round the task weights are ``w = softmax(eps)``, ``eps ~ N(0, std^2 I_m)``, a new draw every round,
including the first (LibMTL's ``weighting/RLW.py``, the authors' code: ``F.softmax(torch.randn(m))``,
weights summing to 1 as here). The draw of round ``t`` (0-based) comes from the run's counter-based
stream ``("rlw", t)`` of the run seed (:func:`fedhv.rng.numpy_rng`): a resumed run, the batched and the
sequential engine and Flower draw the same weights. FedHV's loss-only protocol
(:mod:`fedhv.algorithms.loss_only`): the reports are collected and logged although the rule does not
read them, so RLW runs on FedHV's accounting. Default ``std = 1`` (the authors' standard normal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, softmax
from fedhv.algorithms.method import BuildContext, positive, register
from fedhv.rng import numpy_rng


@dataclass(frozen=True)
class RLWConfig:
    """The ``[rlw]`` section.

    Attributes
    ----------
    std : float
        Standard deviation of the logits ``eps`` (the authors': 1).
    report_batches : int or "all"
        The clients' report budget.
    """

    std: float = 1.0
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive ``std`` or a bad report budget."""
        positive("rlw.std", self.std, "e.g. 1.0 (the authors' standard normal logits)")
        check_report_batches("rlw.report_batches", self.report_batches)


@dataclass(frozen=True)
class RandomWeights:
    """``w^t = softmax(eps^t)``, ``eps^t`` from the stream ``(seed, "rlw", t)``."""

    seed: int
    std: float = 1.0

    def draw(self, num_tasks: int, round_index: int) -> np.ndarray:
        """The weights of round ``round_index`` (0-based)."""
        return softmax(self.std * numpy_rng(self.seed, "rlw", round_index).standard_normal(num_tasks))

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The draw of round 0."""
        return self.draw(num_tasks, 0), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The draw of the next round (the report is not read)."""
        return self.draw(len(report), round_index + 1), memory


@register
@dataclass(frozen=True)
class RLW(LossOnlyMethod):
    """Random loss weighting; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: RLWConfig = field(default_factory=RLWConfig)
    name: ClassVar[str] = "rlw"
    label: ClassVar[str] = "RLW"
    section: ClassVar[type] = RLWConfig
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "a random draw of m logits")

    def rule(self, context: BuildContext) -> RandomWeights:
        """Draws keyed by the run's seed."""
        return RandomWeights(context.seed, self.config.std)
