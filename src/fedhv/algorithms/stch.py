"""STCH, smooth Tchebycheff scalarisation (Lin, Zhang, Zhang, Lin and Zhang, ICML 2024).

The authors' multi-task loss (``Xi-L/STCH``, ``STCH_MTL/LibMTL/weighting/STCH.py``; LibMTL's
``weighting/STCH.py`` is the same) is ``m mu log sum_i exp(log(l_i / z_i + 1e-20) / mu)`` with a nadir
``z`` (the factor ``m`` is their ``self.task_num``). Its gradient weighs task ``i`` by
``m softmax_i(log(l_i / z_i + 1e-20) / mu) / (l_i + 1e-20 z_i)``. Here, from the averaged report ``F^t``::

    w^{t+1}_i = m softmax_i(log(F_i^t / z_i + 1e-20) / mu) / (F_i^t + 1e-20 z_i),

the authors' gradient itself, not normalised: ``sum_i w_i`` is the effective step on the local learning
rate, and it depends on the reports. At ``mu = 1`` the softmax is ``(F_i / z_i + 1e-20) / sum_j (F_j / z_j +
1e-20)``, so ``w_i = m / (z_i sum_j (F_j / z_j + 1e-20))``: the *direction* is fixed (``∝ 1 / z_i``) but its
length ``sum_i w_i = m sum_i (1 / z_i) / sum_j (F_j / z_j + 1e-20)`` grows as the losses fall below the
nadir (about 0.9 in the first rounds of MNIST-FMNIST, 5 at the end). Smaller ``mu`` moves the weight to the
task farthest above its nadir (Tchebycheff as ``mu -> 0``). ``--STCH_mu`` defaults to 1.0 in the authors'
multi-task code (their Pareto-set-learning script uses 0.01), so 1.0 is the default here too.

Where fedhv differs from the authors' code, and why:

- **The nadir and the warm-up.** The authors' run trains its first epochs (0 to ``--STCH_warmup_epoch``, 4)
  on the sum of log-losses, and ``z`` is the mean training-batch loss of its last warm-up epoch; then the
  smooth Tchebycheff loss takes over. Here ``z`` is the mean of the averaged reports of the reference
  calibration (paper §3.2: uniform-weight rounds, shared with FedHV's reference and across a grid), and
  the run uses STCH's weights from its second round (``w^0 = 1/m``), with no warm-up of its own.
- **Weights per round, from the averaged reports.** The authors differentiate the loss of each minibatch,
  so their weights change at every step with that batch's losses; a federated client trains its ``K``
  local steps on the weights the server computed from ``F^t``. As every loss-only rule's, they are one
  round behind the model: ``w^{t+1}`` comes from ``F^t`` at ``theta^t`` and trains from ``theta^{t+1}``.

FedHV's loss-only protocol (:mod:`fedhv.algorithms.loss_only`); the state is a
:class:`~fedhv.algorithms.loss_only.ScaledLossOnlyState` (weights off the simplex) and every round logs
``weight_sum``. Reports must be non-negative (the built-in losses are).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fedhv.algorithms.loss_only import (
    LossOnlyMethod,
    ScaledLossOnlyState,
    check_report_batches,
    memoryless,
    softmax,
    uniform,
)
from fedhv.algorithms.method import BuildContext, Built, Calibration, positive, register
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.config.validation import at_least
from fedhv.errors import ConfigError, FedHVError

#: The authors' shift inside the logarithm.
EPS = 1e-20
#: The smallest ``stch.mu`` (issue 52): the authors' smallest is 0.01 (their Pareto-set script), ``fedhv tune``'s
#: 0.05; at 1e-3 the softmax of log-ratios is the max to within e^-1000 per unit of log-ratio, and ``1e-320``
#: overflowed the log-ratios to NaN weights.
MIN_MU = 1e-3


class STCHError(FedHVError):
    """A negative report or a non-positive nadir (the logarithm is undefined)."""


@dataclass(frozen=True)
class STCHConfig:
    """The ``[stch]`` section.

    Attributes
    ----------
    mu : float
        The smoothing ``mu > 0`` (the authors' default for multi-task learning: 1.0).
    report_batches : int or "all"
        The clients' report budget.
    """

    mu: float = 1.0
    report_batches: int | str = "all"

    def check(self) -> None:
        """Refuse a non-positive ``mu`` or a bad report budget."""
        positive("stch.mu", self.mu, "e.g. 1.0 (the authors'; smaller is closer to Tchebycheff)")
        at_least("stch.mu", self.mu, MIN_MU, "at 1e-3 the smooth max is already the max (Tchebycheff); e.g. 1.0 "
                 "(the authors')")
        check_report_batches("stch.report_batches", self.report_batches)


@dataclass(frozen=True)
class STCHRule:
    """STCH's weight map around the nadir ``z``."""

    nadir: np.ndarray
    mu: float = 1.0
    check_memory = memoryless

    def first(self, num_tasks: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``1/m``."""
        return uniform(num_tasks), ()

    def next(self, report: np.ndarray, memory: tuple[np.ndarray, ...],
             round_index: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The gradient of the authors' loss ``m mu logsumexp(log(F / z + 1e-20) / mu)`` at ``F^t``."""
        f = np.asarray(report, dtype=np.float64)
        if (f < 0).any():
            bad = [i for i, v in enumerate(f) if v < 0]
            raise STCHError(f"round {round_index + 1}: STCH needs non-negative reports, but task(s) {bad} report "
                            f"{[float(f[i]) for i in bad]}; use a method for losses of any sign (e.g. fedhv)")
        z = self.nadir
        return len(f) * softmax(np.log(f / z + EPS) / self.mu) / (f + EPS * z), memory


@register
@dataclass(frozen=True)
class STCH(LossOnlyMethod):
    """Smooth Tchebycheff scalarisation; ``lr_global`` is the server learning rate ``eta_g``."""

    lr_global: float = 1.0
    config: STCHConfig = field(default_factory=STCHConfig)
    name: ClassVar[str] = "stch"
    label: ClassVar[str] = "STCH"
    section: ClassVar[type] = STCHConfig
    #: ``fedhv tune`` searches the smoothing mu (the authors' multi-task default 1; smaller nears Tchebycheff).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("mu", 0.05, 5.0, log=True, authors=(1.0,)),)
    state: ClassVar[type] = ScaledLossOnlyState  # the authors' scale: weights off the simplex
    complexity: ClassVar[tuple[str, str, str]] = (
        "objective estimation, one weighted local trajectory", "Θ(d + m)", "smooth max of log-ratios to a nadir")

    def uses_calibration(self) -> bool:
        """The nadir comes from the reference calibration."""
        return True

    def rule(self, context: BuildContext) -> STCHRule:
        """The rule around the nadir of the run's calibration (see :meth:`build`)."""
        return STCHRule(nadir_of(context.calibration()), self.config.mu)

    def build(self, context: BuildContext) -> Built:
        """The loss-only round around :class:`STCHRule`; the nadir is recorded as the run's reference."""
        calibration = context.calibration()
        built = super().build(context)
        return Built(built.algorithm, nadir_of(calibration).tolist(), "calibration mean (STCH nadir)", calibration)


def nadir_of(calibration: Calibration) -> np.ndarray:
    """``z``: each task's mean over the calibration's averaged reports (every seed, every round)."""
    rows = [row for rounds in calibration.reports.values() for row in rounds]
    z = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
    if not (z > 0).all():
        raise ConfigError(f"STCH's nadir {z.tolist()} (the calibration's mean reports) must be positive; STCH "
                          "needs positive losses")
    return z
