"""The methods as configuration objects that build the round algorithms.

``FedHV``: ``w^{t+1}_i ∝ 1 / max(r_i - F_i^t, rho_clip)`` from averaged client reports
``F^t``; ``r`` given, or calibrated (``r = max_t F^t + margin`` over a uniform-weight run
of ``calibration_rounds`` rounds). ``Uniform``: ``w = 1/m``. ``FSMGDA`` / ``FedCMOO``:
min-norm weights of client gradients (options: :class:`~fedhv.config.schema.FSMGDAConfig`,
:class:`~fedhv.config.schema.FedCMOOConfig`). All: ``theta^{t+1} = theta^t + eta_g mean_k Delta_k``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedhv import algorithms as alg
from fedhv.algorithms.base import Algorithm
from fedhv.algorithms.fedcmoo import FedCMOO as _FedCMOO
from fedhv.algorithms.fsmgda import FSMGDA as _FSMGDA
from fedhv.config.schema import FedCMOOConfig, FSMGDAConfig
from fedhv.models.params import TaskSlices


def _min_norm(algorithm: Callable[..., Algorithm], slices: TaskSlices, lr_global: float,
              config: FSMGDAConfig | FedCMOOConfig, **extra: Any) -> Algorithm:
    """A min-norm method (FSMGDA, FedCMOO) over the encoder/head ``slices``.

    The option dataclass's fields are the algorithm's keyword options, name for name; the
    one construction both the public objects and ``fedhv run`` (:mod:`fedhv.experiment.methods`) use.
    """
    return algorithm(slices, lr_global, **extra, **dataclasses.asdict(config))


@dataclass(frozen=True)
class FedHV:
    """FedHV (paper §3.3). ``reference=None`` calibrates it first."""

    lr_global: float = 1.0
    reference: Sequence[float] | None = None
    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    calibration_rounds: int = 20
    margin: float = 0.15
    calibration_seeds: tuple[int, ...] = (0,)
    name = "fedhv"
    needs_heads = False  # whether the method splits encoder and task heads (``simulate(heads=)``)

    def build(self, reference: Sequence[float], slices: TaskSlices, seed: int) -> Algorithm:
        import numpy as np

        return alg.FedHV(np.asarray(reference, dtype=np.float64), self.lr_global, self.rho_clip, self.report_batches)


@dataclass(frozen=True)
class Uniform:
    """Uniform scalarisation ``w = 1/m`` (FedAvg on the mean task loss)."""

    lr_global: float = 1.0
    name = "uniform"
    needs_heads = False

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int) -> Algorithm:
        return alg.Uniform(self.lr_global)


@dataclass(frozen=True)
class FSMGDA:
    """FSMGDA (Yang et al., 2023): min-norm weights of the clients' task gradients."""

    lr_global: float = 1.0
    config: FSMGDAConfig = field(default_factory=FSMGDAConfig)
    name = "fsmgda"
    needs_heads = True

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int) -> Algorithm:
        return _min_norm(_FSMGDA, slices, self.lr_global, self.config)


@dataclass(frozen=True)
class FedCMOO:
    """FedCMOO (Askin et al., 2025): compressed task gradients, server-side weight optimisation."""

    lr_global: float = 1.0
    config: FedCMOOConfig = field(default_factory=FedCMOOConfig)
    name = "fedcmoo"
    needs_heads = True

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int) -> Algorithm:
        return _min_norm(_FedCMOO, slices, self.lr_global, self.config, seed=seed)


Method = FedHV | Uniform | FSMGDA | FedCMOO
