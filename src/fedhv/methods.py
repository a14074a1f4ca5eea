"""The methods as configuration objects that build the round algorithms.

``FedHV``: ``w^{t+1}_i ∝ 1 / max(r_i - F_i^t, rho_clip)`` from averaged client reports
``F^t``; ``r`` given, or calibrated (``r = max_t F^t + margin`` over a uniform-weight run
of ``calibration_rounds`` rounds). ``Uniform``: ``w = 1/m``. ``FSMGDA`` / ``FedCMOO``:
min-norm weights of client gradients (options: :class:`~fedhv.config.schema.FSMGDAConfig`,
:class:`~fedhv.config.schema.FedCMOOConfig`). All: ``theta^{t+1} = theta^t + eta_g mean_k Delta_k``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fedhv import algorithms as alg
from fedhv.algorithms.base import Algorithm
from fedhv.algorithms.fedcmoo import FedCMOO as _FedCMOO
from fedhv.algorithms.fsmgda import FSMGDA as _FSMGDA
from fedhv.config.schema import FedCMOOConfig, FedHVConfig, FSMGDAConfig, RunConfig
from fedhv.errors import ConfigError
from fedhv.models.params import TaskSlices


def _min_norm(algorithm: Callable[..., Algorithm], slices: TaskSlices, lr_global: float,
              config: FSMGDAConfig | FedCMOOConfig, **extra: Any) -> Algorithm:
    """A min-norm method (FSMGDA, FedCMOO) over the encoder/head ``slices``.

    The option dataclass's fields are the algorithm's keyword options, name for name; the
    one construction both the public objects and ``fedhv run`` (:mod:`fedhv.experiment.methods`) use.
    """
    return algorithm(slices, lr_global, **extra, **dataclasses.asdict(config))


def _with_method(cfg: RunConfig, method: Any, **tables: Any) -> RunConfig:
    """``cfg`` with ``method = method.name``, its ``lr_global`` in ``[train]`` and its option tables."""
    return dataclasses.replace(cfg, method=method.name, train=dataclasses.replace(cfg.train, lr_global=method.lr_global),
                               **tables)


def calibrated_range(calibration: Any) -> list[float]:
    """``d_i = r_i - min_{s,t} F_i^{s,t}``: how far each task's report fell below its reference
    during the calibration (its loss scale; the scale-free variant's unit of slack)."""
    rows = [row for rounds in calibration.reports.values() for row in rounds]
    low = [min(row[i] for row in rows) for i in range(len(calibration.reference))]
    return [r - lo for r, lo in zip(calibration.reference, low)]


def slack_scale_values(spec: str | Sequence[float], m: int, calibration: Any | None) -> list[float] | None:
    """The slack scales ``d`` of ``slack_scale = spec`` (``None`` for the paper's map)."""
    if isinstance(spec, str):
        if spec == "none":
            return None
        if spec != "calibrated-range":
            raise ConfigError(f"slack_scale = {spec!r} is unknown; use \"none\" (the paper's map), "
                              "\"calibrated-range\" or one positive number per task")
        if calibration is None:
            raise ConfigError("slack_scale = \"calibrated-range\" needs a calibration (reference = None / "
                              "\"calibrate\"); with a given reference pass one scale per task")
        values = calibrated_range(calibration)
    else:
        values = [float(v) for v in spec]
    if len(values) != m or not all(math.isfinite(v) and v > 0 for v in values):
        raise ConfigError(f"slack_scale = {values} must be {m} finite positive numbers (one per task)")
    return values


@dataclass(frozen=True)
class FedHV:
    """FedHV (paper §3.3). ``reference=None`` calibrates it first.

    Defaults: ``lr_global = 1.0``, ``reference = None`` (calibrate: ``calibration_rounds = 20``
    uniform-weight rounds with ``calibration_seeds = (0,)``, ``r = max_t F^t + margin``,
    ``margin = 0.15``), ``rho_clip = 1e-6``, ``report_batches = "all"`` (each client reports
    over its whole local dataset), ``slack_scale = "none"`` (the paper's map; see
    :func:`fedhv.weighting.hv_weights` for ``"calibrated-range"``, the scale-free variant).
    """

    lr_global: float = 1.0
    reference: Sequence[float] | None = None
    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    calibration_rounds: int = 20
    margin: float = 0.15
    calibration_seeds: tuple[int, ...] = (0,)
    slack_scale: str | Sequence[float] = "none"
    name = "fedhv"
    needs_heads = False  # whether the method splits encoder and task heads (``simulate(heads=)``)

    def configure(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` running this method with these options (``method``, ``[fedhv]``, ``[calibration]``)."""
        ref = "calibrate" if self.reference is None else tuple(float(v) for v in self.reference)
        scale = self.slack_scale if isinstance(self.slack_scale, str) else tuple(float(v) for v in self.slack_scale)
        return _with_method(cfg, self, fedhv=FedHVConfig(self.rho_clip, self.report_batches, ref, scale),
                            calibration=dataclasses.replace(cfg.calibration, rounds=self.calibration_rounds,
                                                            margin=self.margin, seeds=tuple(self.calibration_seeds)))

    def build(self, reference: Sequence[float], slices: TaskSlices, seed: int,
              calibration: Any | None = None) -> Algorithm:
        import numpy as np

        scale = slack_scale_values(self.slack_scale, len(reference), calibration)
        return alg.FedHV(np.asarray(reference, dtype=np.float64), self.lr_global, self.rho_clip, self.report_batches,
                         slack_scale=None if scale is None else np.asarray(scale, dtype=np.float64))


@dataclass(frozen=True)
class Uniform:
    """Uniform scalarisation ``w = 1/m`` (FedAvg on the mean task loss)."""

    lr_global: float = 1.0
    name = "uniform"
    needs_heads = False

    def configure(self, cfg: RunConfig) -> RunConfig:
        return _with_method(cfg, self)

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int,
              calibration: Any | None = None) -> Algorithm:
        return alg.Uniform(self.lr_global)


@dataclass(frozen=True)
class FSMGDA:
    """FSMGDA (Yang et al., 2023): min-norm weights of the clients' task gradients."""

    lr_global: float = 1.0
    config: FSMGDAConfig = field(default_factory=FSMGDAConfig)
    name = "fsmgda"
    needs_heads = True

    def configure(self, cfg: RunConfig) -> RunConfig:
        return _with_method(cfg, self, fsmgda=self.config)

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int,
              calibration: Any | None = None) -> Algorithm:
        return _min_norm(_FSMGDA, slices, self.lr_global, self.config)


@dataclass(frozen=True)
class FedCMOO:
    """FedCMOO (Askin et al., 2025): compressed task gradients, server-side weight optimisation."""

    lr_global: float = 1.0
    config: FedCMOOConfig = field(default_factory=FedCMOOConfig)
    name = "fedcmoo"
    needs_heads = True

    def configure(self, cfg: RunConfig) -> RunConfig:
        return _with_method(cfg, self, fedcmoo=self.config)

    def build(self, reference: Sequence[float] | None, slices: TaskSlices, seed: int,
              calibration: Any | None = None) -> Algorithm:
        return _min_norm(_FedCMOO, slices, self.lr_global, self.config, seed=seed)


Method = FedHV | Uniform | FSMGDA | FedCMOO
