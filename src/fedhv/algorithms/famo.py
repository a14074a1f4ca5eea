"""FAMO, fast adaptive multitask optimization (Liu, Liu, Stone and Liu, NeurIPS 2023).

The server keeps logits ``xi`` (``0`` initially) and, from the averaged report ``F^t``, with
``D_i^t = F_i^t - F_i^* + 1e-8`` (``F^* = min_loss``, 0 by default)::

    z = softmax(xi),   c = sum_j z_j / D_j^t,   w^{t+1}_i = z_i / (c D_i^t),

weights that sum to 1 (FAMO's loss ``sum_i z_i log D_i / c`` has exactly this gradient). Before that,
once a previous report exists, ``xi`` takes one Adam step (learning rate ``lr = 0.025``, betas
``(0.9, 0.999)``, ``eps = 1e-8``, L2 weight decay ``weight_decay`` added to the gradient, as
``torch.optim.Adam``) on the gradient ``J_softmax(xi)^T delta`` with
``delta_i = log D_i^{t-1} - log D_i^t``, the decrease of each task's log loss over the last round.

This follows the authors' code (``Cranial-XIX/FAMO``; LibMTL's ``weighting/FAMO.py``, its
``FAMO_w_lr = 0.025``, ``FAMO_w_gamma = 1e-3``). The authors' weight decay ``gamma`` differs by file:
0.01 (``famo.py``'s default, ``experiments/utils.py``'s ``--gamma`` and the Cityscapes script), 1e-3 (the
NYUv2, CelebA and QM9 scripts, and LibMTL), 0.0 (the toy script); 1e-5 is only the default of
``methods/weight_methods.py``'s class, which every script overrides. The default here is 1e-3, the others
are one ``--set famo.weight_decay=...`` away. Federated, ``delta`` compares the reports of two consecutive
rounds, which come from different client cohorts, where FAMO's ``delta`` compares the losses of one
batch before and after a step: a cohort's different data moves ``delta`` too. And the weights are one round behind the model:
``w^{t+1}`` is computed from ``F^t`` (measured at ``theta^t``) and trains from ``theta^{t+1}``, so the Adam
step at round ``t`` moves the logits that produced ``w^t`` on a ``delta`` that measures the step
``theta^{t-1} -> theta^t``, trained with ``w^{t-1}`` (the authors' ``delta`` measures the step their current
logits made). Both follow from FedHV's one exchange per round, as FedHV's own weights do. FedHV's loss-only
protocol (:mod:`fedhv.algorithms.loss_only`); ``w^0 = 1/m``. Losses must stay above ``min_loss``
(``D > 0``), which holds for the built-in losses (cross-entropies, ``>= 0``) with ``min_loss = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import LossOnlyMethod, check_report_batches, softmax, uniform
from fedhv.algorithms.method import BuildContext, positive, register
from fedhv.algorithms.plain import StateError
from fedhv.algorithms.tuning import Choice, Dimension, Range
from fedhv.config.validation import MAX_LOSS_LEVEL, at_most
from fedhv.errors import ConfigError, FedHVError

#: Adam's constants (``torch.optim.Adam``'s defaults, as the authors' code uses them).
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
#: The shift of ``D = F - F^* + 1e-8`` (the authors').
SHIFT = 1e-8
#: Bounds on ``famo.lr`` and ``famo.weight_decay`` (issue 52): Adam moves each logit by about ``lr`` a round,
#: so 10 (400 times the authors' 0.025, 100 times ``fedhv tune``'s largest) already gives one task all the
#: weight within a round; the authors' decays are 0 to 0.01, and a decay of 1 outweighs the log-loss
#: decreases it is added to. Far larger values overflowed the logits or Adam's moments to NaN weights.
MAX_LR = 10.0
MAX_WEIGHT_DECAY = 1.0


class FAMOError(FedHVError):
    """A report at or below FAMO's ``min_loss`` (its logarithm is undefined)."""


@dataclass(frozen=True)
class FAMOConfig:
    """The ``[famo]`` section.

    Attributes
    ----------
    lr : float
        Adam's learning rate on the logits (the authors': 0.025).
    weight_decay : float
        Adam's L2 weight decay on the logits (default 1e-3; the authors' scripts: 0.01, 1e-3, 0.0).
    min_loss : float
        ``F^*``, the losses' lower bound (0 for non-negative losses).
    report_batches : int or "all"
        The clients' report budget.
    """

    lr: float = 0.025
    weight_decay: float = 1e-3
    min_loss: float = 0.0
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive learning rate, a negative weight decay or a bad report budget."""
        positive("famo.lr", self.lr, "e.g. 0.025 (the authors')")
        at_most("famo.lr", self.lr, MAX_LR, "Adam moves each logit by about famo.lr a round, so 10 already puts "
                "all weight on one task in a round (1e308 overflowed the logits to NaN weights); e.g. 0.025")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"famo.weight_decay = {self.weight_decay} must be >= 0, e.g. 1e-3")
        at_most("famo.weight_decay", self.weight_decay, MAX_WEIGHT_DECAY,
                "the authors' scripts use 0 to 0.01; e.g. 1e-3")
        if not abs(self.min_loss) <= MAX_LOSS_LEVEL:
            raise ConfigError(f"famo.min_loss = {self.min_loss} is outside fedhv's bound of ±{MAX_LOSS_LEVEL:g} (a loss "
                              "level); it is the losses' lower bound, e.g. 0 for non-negative losses")
        check_report_batches("famo.report_batches", self.report_batches)


def softmax_vjp(xi: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """``J_softmax(xi)^T delta = z * (delta - z . delta)`` with ``z = softmax(xi)``."""
    z = softmax(xi)
    return z * (delta - float(z @ delta))


@dataclass(frozen=True)
class FAMORule:
    """FAMO's rule; memory ``(F^{t-1}, xi, Adam's m, Adam's v, [steps])`` once a report exists."""

    lr: float = 0.025
    weight_decay: float = 1e-3
    min_loss: float = 0.0

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m``, nothing remembered."""
        return uniform(num_tasks), ()

    def check_memory(self, memory: tuple[np.ndarray, ...], num_tasks: int) -> None:
        """Refuse a (resumed) memory FAMO cannot read (:class:`StateError`).

        It must be ``()`` or ``(F^{t-1} [m], xi [m], m [m], v [m], [steps])`` with ``F^{t-1}`` above
        ``min_loss``, Adam's ``v >= 0`` and a whole ``steps >= 0``.
        """
        if not memory:
            return
        shapes = [np.shape(a) for a in memory]
        if shapes != [(num_tasks,)] * 4 + [(1,)]:
            raise StateError(f"famo memory has arrays of shapes {[list(s) for s in shapes]}; FAMO's is "
                             f"(F^(t-1), logits, Adam's m, Adam's v) of {num_tasks} values each and [steps]")
        previous, _, _, var, steps = memory
        if not (previous - self.min_loss + SHIFT > 0).all():
            raise StateError(f"famo memory's last report {previous.tolist()} is not above famo.min_loss = "
                             f"{self.min_loss}")
        if (var < 0).any():
            raise StateError(f"famo memory's Adam second moment {var.tolist()} has a negative entry (it is a mean "
                             "of squares)")
        if not (steps[0] >= 0 and float(steps[0]).is_integer()):
            raise StateError(f"famo memory's Adam step count {steps.tolist()} is not a whole number >= 0")

    def _d(self, report: np.ndarray, round_index: int) -> np.ndarray:
        d = np.asarray(report, dtype=np.float64) - self.min_loss + SHIFT
        if not (d > 0).all():
            bad = [i for i, v in enumerate(d) if not v > 0]
            raise FAMOError(f"round {round_index + 1}: FAMO needs reports above famo.min_loss = {self.min_loss}, but "
                            f"task(s) {bad} report {[float(report[i]) for i in bad]}; lower famo.min_loss below the "
                            "losses' bound")
        return d

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """One Adam step on ``xi`` from the last two reports (when there are two), then the weights."""
        m = len(report)
        d = self._d(report, round_index)
        if memory:
            previous, xi, mom, var, steps = memory
            grad = softmax_vjp(xi, np.log(self._d(previous, round_index - 1)) - np.log(d)) + self.weight_decay * xi
            t = int(steps[0]) + 1
            mom = BETAS[0] * mom + (1 - BETAS[0]) * grad
            var = BETAS[1] * var + (1 - BETAS[1]) * grad * grad
            denom = np.sqrt(var) / math.sqrt(1 - BETAS[1] ** t) + ADAM_EPS
            xi = xi - (self.lr / (1 - BETAS[0] ** t)) * mom / denom
            steps = np.array([float(t)])
        else:
            xi, mom, var, steps = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(1)
        z = softmax(xi)
        c = float((z / d).sum())
        weights = z / (c * d)
        return weights, (np.asarray(report, dtype=np.float64).copy(), xi, mom, var, steps)


@register
@dataclass(frozen=True)
class FAMO(LossOnlyMethod):
    """FAMO; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: FAMOConfig = field(default_factory=FAMOConfig)
    name: ClassVar[str] = "famo"
    label: ClassVar[str] = "FAMO"
    section: ClassVar[type] = FAMOConfig
    #: ``fedhv tune`` searches the logits' Adam step (the authors' 0.025) and its weight decay (the authors'
    #: scripts: 0.01, 1e-3 and 0).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("lr", 0.005, 0.1, log=True, authors=(0.025,)),
                                               Choice("weight_decay", (0.0, 1e-3, 1e-2)))
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "one Adam step on m logits")

    def rule(self, context: BuildContext) -> FAMORule:
        """The rule with the configured Adam step and loss bound."""
        c = self.config
        return FAMORule(c.lr, c.weight_decay, c.min_loss)
