"""The Gramian aggregators of multi-task learning, through torchjd, on FSMGDA's and FedCMOO's exchanges.

Each rule below maps the tasks' Gramian ``G = J J^T`` (``J``: the ``m`` task directions as rows) to weights
``w`` whose combination ``J^T w`` is the aggregator's direction, computed by torchjd's ``*Weighting``
classes (torchjd 0.18, Rey, Quinton et al., "Jacobian Descent for Multi-Objective Optimization", 2024: a
maintained library of exactly these aggregators; ``pip install 'fedhv[gramian]'`` brings it with the
quadprog QP solver and, for CAGrad, cvxpy with Clarabel). Each is registered twice
(:func:`fedhv.algorithms.gramian.gramian_method`): ``fsmgda-<rule>`` on FSMGDA's exchange (exact
averaged task updates) and ``fedcmoo-<rule>`` on FedCMOO's (randomized-SVD Gram estimate). MGDA itself is
:class:`fedhv.FSMGDA` / :class:`fedhv.FedCMOO`.

- **UPGrad** (Rey, Quinton et al. 2024): each row projected onto the dual cone of the rows, the projections
  averaged: ``w = sum_i proj(e_i / m)``. ``reg_eps = 1e-4`` (torchjd's quadprog projector; relative to the
  trace, see :func:`~fedhv.algorithms.gramian.torchjd_weights`).
- **DualProj** (Lopez-Paz & Ranzato, GEM, NeurIPS 2017): the mean direction projected onto the dual cone.
- **CAGrad** (Liu et al., NeurIPS 2021): ``w = 1/m + (sqrt(phi) / ||J^T w*||) w*``, ``sqrt(phi) = c ||g_0||``,
  ``w* = argmin_{w in simplex} w^T G 1/m + sqrt(phi) sqrt(w^T G w)``; ``c = 0.4``, the value the authors'
  multi-task scripts run (``Cranial-XIX/CAGrad``, ``nyuv2/run.sh`` and ``cityscapes/run.sh``: ``--alpha 0.4``;
  the function's own default is 0.5). Their ``cagrad`` then divides the direction by ``1 + c^2``
  (``rescale = 1``, its default); here that is the option ``rescale = true`` (default ``false``: torchjd's
  weights as they are, a factor ``1 + c^2 = 1.16`` on ``eta_g`` against the authors' scripts). Remaining
  differences: torchjd solves the inner problem with cvxpy + Clarabel where the authors use SciPy's SLSQP
  (solver tolerance), and the authors add ``1e-8`` inside ``||g_0||`` and the norms (negligible on ``G /
  trace(G)``).
- **PCGrad** (Yu et al., NeurIPS 2020): each task's direction, in a random order, stripped of its conflicting
  components. The authors sum the projected gradients; fedhv takes their mean (torchjd's weights ``/ m``: a
  factor ``1/m`` on ``eta_g``). The order is drawn from the run's counter-based stream
  ``(seed, "pcgrad", round)`` (torchjd draws it from torch's global generator, which fedhv forks and seeds).
- **IMTL-G** (Liu et al., ICLR 2021): the direction with equal projections on every task's unit direction,
  ``w = G^+ d / sum(G^+ d)``, ``d_i = sqrt(G_ii)`` (torchjd's pseudo-inverse generalisation).
- **Aligned-MTL** (Senushkin et al., CVPR 2023): ``w = B 1``, ``B = sqrt(lambda_s) V Sigma^{-1/2} V^T`` from
  the eigendecomposition ``G = V Sigma V^T`` restricted to the eigenvalues above ``lambda_max m eps`` (the
  numerical rank). The authors' code (``SamsungLabs/MTL``, ``optim/aligned/solver.py`` and ``balancer.py``;
  LibMTL's ``Aligned_MTL.py`` the same) sums the balanced task gradients, ``J^T B 1``: torchjd's weighting
  averages them (``B 1/m``), so fedhv multiplies torchjd's weights by ``m``. ``scale_mode`` picks
  ``lambda_s``: ``"min"`` (the smallest kept eigenvalue; the authors' default, ``AlignedMTLBalancer(
  scale_mode='min')``, and the paper's Algorithm 1), ``"median"`` or ``"rmse"`` (the mean eigenvalue), the
  authors' three modes. Remaining difference: the rank tolerance uses float64's ``eps`` (fedhv's Gramians are
  float64) where the authors' ``torch.finfo()`` is float32's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fedhv.algorithms.gramian import (
    FEDCMOO_EXCHANGE,
    FSMGDA_EXCHANGE,
    GRAMIAN_EXTRA,
    GramianInputs,
    gramian_method,
    torchjd_module,
    torchjd_weights,
)
from fedhv.algorithms.tuning import Choice, Dimension, Range
from fedhv.config.validation import at_most, choice
from fedhv.errors import ConfigError
from fedhv.rng import derive_seed


def _non_negative(key: str, **values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ConfigError(f"{key}.{name} = {value} must be >= 0")


#: Bounds on the rules' settings (issue 52). ``reg_eps`` regularises the trace-normalised Gramian (trace 1), so a
#: regularisation of 1 already outweighs the Gramian itself (torchjd's default: 1e-4; 1e308 made quadprog fail
#: mid-run). CAGrad's ``c``: the authors' theory takes ``c`` in [0, 1), their scripts 0.4 / 0.5, ``fedhv tune`` at
#: most 0.9; at 10 the step is already ten times the mean gradient's length (1e308 made the cone program fail).
MAX_REG_EPS = 1.0
MAX_CAGRAD_C = 10.0


@dataclass(frozen=True)
class _TorchJDRule:
    """A rule computed by torchjd (:meth:`require` checks it is installed before round 1)."""

    needs_losses: ClassVar[bool] = False

    def require(self, what: str) -> None:
        """Import torchjd and the solver this rule needs, and solve a 2 x 2 problem, or refuse naming the extra."""
        try:
            self.weights(GramianInputs(np.eye(2), np.full(2, 0.5), 0, 0))
        except ImportError as exc:
            raise ConfigError(f"{what} needs a solver that is not installed ({exc}): {GRAMIAN_EXTRA}") from exc

    def weighting(self) -> object:
        """The torchjd ``Weighting`` of this rule."""
        raise NotImplementedError

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """torchjd's weights of ``inputs.gram``."""
        return torchjd_weights(self.weighting(), inputs.gram)

    def check_rule(self, key: str) -> None:
        """Nothing to refuse."""


@dataclass(frozen=True)
class _DualConeRule(_TorchJDRule):
    """A rule of dual-cone projections (torchjd's quadprog projector on ``G / trace(G)``, regularised by
    ``reg_eps``); a subclass names its torchjd ``Weighting`` class."""

    reg_eps: float = 1e-4
    rule_name: ClassVar[str]
    weighting_class: ClassVar[str]

    def weighting(self) -> object:
        """The named torchjd ``Weighting`` with a ``QuadprogProjector(reg_eps)``."""
        agg = torchjd_module(self.rule_name)
        from torchjd.linalg import QuadprogProjector

        return getattr(agg, self.weighting_class)(projector=QuadprogProjector(reg_eps=self.reg_eps))

    def check_rule(self, key: str) -> None:
        """Refuse a negative regularisation, or one above the normalised Gramian's trace."""
        _non_negative(key, reg_eps=self.reg_eps)
        at_most(f"{key}.reg_eps", self.reg_eps, MAX_REG_EPS, "it regularises the Gramian normalised to trace 1; "
                "e.g. 1e-4 (torchjd's)")


@dataclass(frozen=True)
class UPGrad(_DualConeRule):
    """UPGrad's rule: every task projected on the dual cone, the projections averaged."""

    rule_name: ClassVar[str] = "upgrad"
    label: ClassVar[str] = "UPGrad"
    server_work: ClassVar[str] = "m dual-cone projections (QPs of size m)"
    weighting_class: ClassVar[str] = "UPGradWeighting"


@dataclass(frozen=True)
class DualProj(_DualConeRule):
    """DualProj's rule: the mean direction projected on the dual cone."""

    rule_name: ClassVar[str] = "dualproj"
    label: ClassVar[str] = "DualProj"
    server_work: ClassVar[str] = "one dual-cone projection (a QP of size m)"
    weighting_class: ClassVar[str] = "DualProjWeighting"


@dataclass(frozen=True)
class CAGrad(_TorchJDRule):
    """CAGrad's rule; ``c`` is the radius of its ball (the authors' scripts' 0.4); ``rescale`` divides the
    weights by ``1 + c^2`` (the authors' ``rescale = 1``)."""

    c: float = 0.4
    rescale: bool = False
    rule_name: ClassVar[str] = "cagrad"
    #: ``fedhv tune`` searches the radius c (the authors' scripts: 0.4; their function's default 0.5).
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("c", 0.1, 0.9, authors=(0.4, 0.5)),)
    label: ClassVar[str] = "CAGrad"
    server_work: ClassVar[str] = "a second-order cone program of size m"

    def weighting(self) -> object:
        """``CAGradWeighting(c)``."""
        return torchjd_module(self.rule_name).CAGradWeighting(c=self.c)

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """torchjd's weights, divided by ``1 + c^2`` when ``rescale``."""
        w = torchjd_weights(self.weighting(), inputs.gram)
        return w / (1.0 + self.c ** 2) if self.rescale else w

    def check_rule(self, key: str) -> None:
        """Refuse a negative radius or a ``rescale`` that is not a boolean."""
        _non_negative(key, c=self.c)
        at_most(f"{key}.c", self.c, MAX_CAGRAD_C, "the authors' theory takes c in [0, 1); e.g. 0.4 (their scripts')")
        if not isinstance(self.rescale, bool):
            raise ConfigError(f"{key}.rescale = {self.rescale!r} must be true or false (true: divide by 1 + c^2, "
                              "the authors' rescale = 1)")


@dataclass(frozen=True)
class PCGrad(_TorchJDRule):
    """PCGrad's rule: torchjd's weights divided by ``m`` (the mean of the projected directions)."""

    rule_name: ClassVar[str] = "pcgrad"
    label: ClassVar[str] = "PCGrad"
    server_work: ClassVar[str] = "m (m - 1) projections in a random order"

    def weighting(self) -> object:
        """``PCGradWeighting()``."""
        return torchjd_module(self.rule_name).PCGradWeighting()

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """torchjd's weights / ``m``, its random order drawn from ``(seed, "pcgrad", round)``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(inputs.seed, "pcgrad", inputs.round_index))
            w = torchjd_weights(self.weighting(), inputs.gram)
        return w / len(w)


@dataclass(frozen=True)
class IMTLG(_TorchJDRule):
    """IMTL-G's rule (torchjd's pseudo-inverse form)."""

    rule_name: ClassVar[str] = "imtl-g"
    label: ClassVar[str] = "IMTL-G"
    server_work: ClassVar[str] = "a pseudo-inverse of the m x m Gramian"

    def weighting(self) -> object:
        """``IMTLGWeighting()``."""
        return torchjd_module(self.rule_name).IMTLGWeighting()


@dataclass(frozen=True)
class AlignedMTL(_TorchJDRule):
    """Aligned-MTL's rule, ``w = B 1`` (the authors' sum); ``scale_mode`` picks the eigenvalue that scales ``B``
    (``min``, the authors' default; ``median``, ``rmse``)."""

    scale_mode: str = "min"
    rule_name: ClassVar[str] = "aligned-mtl"
    #: ``fedhv tune`` picks one of the authors' three scale modes.
    tuning: ClassVar[tuple[Dimension, ...]] = (Choice("scale_mode", ("min", "median", "rmse")),)
    label: ClassVar[str] = "Aligned-MTL"
    server_work: ClassVar[str] = "an eigendecomposition of the m x m Gramian"

    def weighting(self) -> object:
        """``AlignedMTLWeighting(scale_mode=...)``."""
        return torchjd_module(self.rule_name).AlignedMTLWeighting(scale_mode=self.scale_mode)

    def weights(self, inputs: GramianInputs) -> np.ndarray:
        """``m`` times torchjd's ``B 1/m``: the authors' ``B 1``."""
        w = torchjd_weights(self.weighting(), inputs.gram)
        return len(w) * w

    def check_rule(self, key: str) -> None:
        """Refuse an unknown scale mode."""
        choice(f"{key}.scale_mode", self.scale_mode, ("min", "median", "rmse"))


RULES: tuple[type, ...] = (UPGrad, DualProj, CAGrad, PCGrad, IMTLG, AlignedMTL)

for _exchange in (FSMGDA_EXCHANGE, FEDCMOO_EXCHANGE):
    for _rule in RULES:
        gramian_method(_exchange, _rule)
