"""FedHV: hypervolume weighting from objective reports (paper §3.3, Appendix E).

Round ``t`` (server holds ``theta^t`` and ``w^t``; ``w^0 = 1/m``):

1. broadcast ``(theta^t, w^t)`` to the sampled clients ``S_t``;
2. client ``k`` reports ``F_k^t`` = its ``m`` task losses at ``theta^t`` (eval mode,
   over ``B_rep`` minibatches or its whole local dataset), then runs ``K`` local SGD
   steps on ``sum_i w_i^t l_i`` and returns ``(Delta theta_k^t, F_k^t)``;
3. ``theta^{t+1} = theta^t + eta_g mean_k Delta theta_k^t``,
   ``F^t = mean_k F_k^t``, ``w^{t+1} = W_{rho_clip}(F^t; r)``.

The weights are one round stale by design: reports collected in round ``t``
determine the weights of round ``t + 1``. The protocol adds exactly ``2m`` scalars
per participating client (``m`` weights down, ``m`` reports up).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from fedhv.algorithms.base import Federation, Request, StepResult, fedavg_step
from fedhv.algorithms.loss_only import check_report_batches
from fedhv.algorithms.method import BuildContext, Built, Calibration, Method, choice, positive, register
from fedhv.algorithms.plain import StateError, array_from_plain, array_to_plain, fields
from fedhv.algorithms.tuning import Dimension, Range
from fedhv.algorithms.weight_check import check_weights, source_text
from fedhv.config.schema import CalibrationConfig
from fedhv.config.validation import MAX_LOSS_LEVEL, MIN_FLOOR, at_least
from fedhv.errors import ConfigError
from fedhv.weighting import hv_weights

#: A value that works, for each list key's message.
_EXAMPLES = {"reference": "[2.45, 2.45]", "slack_scale": "\"calibrated-range\"", "direction": "[0.25, 0.75]"}

if TYPE_CHECKING:
    from fedhv.config.schema import RunConfig

log = logging.getLogger("fedhv")


@dataclass(frozen=True)
class FedHVConfig:
    """FedHV's hyper-parameters, the ``[fedhv]`` section (paper B.7).

    Attributes
    ----------
    rho_clip : float
        Numerical slack floor ``rho_clip > 0`` of the weight map (paper: 1e-6).
    report_batches : int or "all"
        Objective-report budget ``B_rep``: minibatches of ``train.batch_size`` samples, or the
        whole local dataset (paper: all).
    reference : "calibrate", "paper" or list of float
        Training reference ``r``: from a calibration run (``[calibration]``), the paper's
        Table 6, or given directly.
    slack_scale : "none", "calibrated-range" or list of float
        ``"none"``: the paper's map; ``"calibrated-range"``: slack in units of each task's
        ``r_i - min_t F_i^t`` over the calibration; or one positive scale per task
        (:func:`fedhv.weighting.hv_weights`).
    direction : "uniform" or list of float
        The calibrated reference's direction ``u`` (normalised to sum 1):
        ``r = max_t F^t + margin * m * u`` (:func:`calibrated_reference`); ``"uniform"`` is the
        paper's ``r = max_t F^t + margin``. Far along ``u`` the weights tend to ``1/u`` (linear
        scalarisation); a front sweep varies it (issue 41, docs/fronts.md).
    """

    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    reference: str | tuple[float, ...] = "calibrate"
    slack_scale: str | tuple[float, ...] = "none"
    direction: str | tuple[float, ...] = "uniform"

    def check(self) -> None:
        """Refuse values the weight map cannot use (one line naming ``fedhv.<key>``, the value and the fix)."""
        positive("fedhv.rho_clip", self.rho_clip, "the slack floor must be positive, e.g. 1e-6")
        at_least("fedhv.rho_clip", self.rho_clip, MIN_FLOOR, "1 / rho_clip must stay finite; e.g. 1e-6 (the paper's)")
        for key in ("reference", "slack_scale", "direction"):
            values = getattr(self, key)
            if not isinstance(values, str):
                for i, v in enumerate(values):
                    if key == "slack_scale" and not (isinstance(v, (int, float)) and v > 0):
                        raise ConfigError(f"fedhv.slack_scale[{i}] = {v} must be > 0 (a task's loss scale); e.g. "
                                          "[1.0, 0.5] or \"calibrated-range\"")
                    if isinstance(v, (int, float)) and not abs(v) <= MAX_LOSS_LEVEL or (
                            key != "reference" and isinstance(v, (int, float)) and 0 < v < 1 / MAX_LOSS_LEVEL):
                        raise ConfigError(f"fedhv.{key}[{i}] = {v} is outside fedhv's range [{1 / MAX_LOSS_LEVEL:g}, "
                                          f"{MAX_LOSS_LEVEL:g}] (a loss level or its scale: the weights' sums would "
                                          f"overflow); give values of the losses' scale, e.g. {_EXAMPLES[key]}")
        check_report_batches("fedhv.report_batches", self.report_batches)
        if isinstance(self.reference, str):
            choice("fedhv.reference", self.reference, ("calibrate", "paper"))
        else:
            for i, r in enumerate(self.reference):
                if not r > 0:
                    raise ConfigError(
                        f"fedhv.reference[{i}] = {r} gives a non-positive slack r_i - f_i for any "
                        "non-negative loss; give a reference above the task losses or use "
                        "fedhv.reference = \"calibrate\""
                    )
        check_direction("fedhv.direction", self.direction)
        if self.direction != "uniform" and self.reference != "calibrate":
            raise ConfigError(f"fedhv.direction = {list(self.direction)} aims a calibrated reference, but fedhv.reference "
                              f"= {self.reference!r}; drop the direction or use fedhv.reference = \"calibrate\"")


@dataclass(frozen=True)
class FedHVState:
    """Mutable-by-replacement FedHV server state.

    Attributes
    ----------
    weights : ndarray ``[m]``
        ``w^t`` for the coming round.
    last_report : ndarray ``[m]`` or None
        ``F^{t-1}``, the last averaged report.
    """

    weights: np.ndarray
    last_report: np.ndarray | None = None
    kind: ClassVar[str] = "fedhv"

    @property
    def num_tasks(self) -> int:
        """``m``, the number of tasks."""
        return len(self.weights)

    def to_plain(self) -> dict[str, Any]:
        """``{"weights": Tensor [m], "last_report": Tensor [m] or None}`` (same dtypes)."""
        return {"weights": array_to_plain(self.weights), "last_report": array_to_plain(self.last_report)}

    @classmethod
    def from_plain(cls, data: Any) -> FedHVState:
        """Inverse of :meth:`to_plain`; weights must lie on the simplex, reports be finite."""
        d = fields(data, cls.kind, ("weights", "last_report"))
        weights = array_from_plain(d["weights"], "fedhv weights")
        report = array_from_plain(d["last_report"], "fedhv last_report", optional=True)
        assert weights is not None
        if (weights < 0).any() or abs(float(weights.sum()) - 1.0) > 1e-6:
            raise StateError(f"fedhv weights {weights.tolist()} are not on the simplex (>= 0, sum 1)")
        if report is not None and len(report) != len(weights):
            raise StateError(f"fedhv last_report has {len(report)} values for {len(weights)} weights")
        return cls(weights, report)


@dataclass(frozen=True)
class FedHVAlgorithm:
    """FedHV's round logic with a fixed training reference.

    Parameters
    ----------
    reference : ndarray ``[m]``
        Training reference ``r`` (from calibration or given).
    lr_global : float
        Server learning rate ``eta_g``.
    rho_clip : float
        Slack floor of the weight map (paper: 1e-6).
    report_batches : int or "all"
        Report budget ``B_rep`` (paper default: all).
    slack_scale : ndarray ``[m]`` or None
        Opt-in scale-free variant: slacks in units of ``slack_scale`` (e.g. each task's
        calibrated range ``r_i - min_t F_i^t``; :func:`fedhv.weighting.hv_weights`). ``None``
        is the paper's map.
    """

    reference: np.ndarray
    lr_global: float
    rho_clip: float = 1e-6
    report_batches: int | str = "all"
    name: str = "fedhv"
    slack_scale: np.ndarray | None = None

    def init_state(self, num_tasks: int) -> FedHVState:
        """``w^0 = 1/m``, no report yet."""
        if len(self.reference) != num_tasks:
            raise ValueError(f"reference has {len(self.reference)} entries for {num_tasks} tasks")
        return FedHVState(weights=np.full(num_tasks, 1.0 / num_tasks))

    def round(self, state: FedHVState, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One FedHV round: a single stage (model + ``w`` down, update + report up)."""
        weights = np.asarray(state.weights, dtype=np.float32)
        replies = federation.exchange(
            theta, Request(payload={"weights": weights}, report=self.report_batches, train=state.weights[None, :])
        )
        assert replies.reports is not None and replies.deltas is not None
        new_theta = fedavg_step(theta, replies.deltas[:, 0], self.lr_global, replies.weights)
        report = replies.reports.double().mean(0).cpu().numpy()
        hv = hv_weights(report, self.reference, self.rho_clip, self.slack_scale)
        check_weights(hv.weights, name=self.name, round_index=getattr(federation, "round_idx", None), kind="simplex",
                      source=lambda: self._source(report), num_tasks=len(self.reference))
        log = {
            "weights": state.weights.tolist(),
            "report": report.tolist(),
            "min_slack": float(hv.raw_slack.min()),
            "floor_activations": int(hv.floor_active.sum()),
            "next_weights": hv.weights.tolist(),
        }
        return StepResult(new_theta, replace(state, weights=hv.weights, last_report=report), log)

    def _source(self, report: np.ndarray) -> str:
        """What the weight map read, for a failed weight check's message."""
        scale = "" if self.slack_scale is None else f" with {source_text('fedhv.slack_scale', self.slack_scale)}"
        return (f"{source_text('the averaged report', report)}, {source_text('the reference r =', self.reference)} "
                f"(fedhv.reference, or calibration.margin over a calibration) and fedhv.rho_clip = {self.rho_clip:g}"
                f"{scale}")


def check_direction(key: str, direction: str | Sequence[float]) -> None:
    """Refuse a direction that is not ``"uniform"`` or positive finite numbers (naming ``key``)."""
    if isinstance(direction, str):
        choice(key, direction, ("uniform",))
    elif not direction or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in direction):
        raise ConfigError(f"{key} = {list(direction)} must be positive finite numbers, one per task (a zero entry "
                          "puts that task's reference at its calibration maximum); e.g. [0.25, 0.75] or \"uniform\"")


def calibrated_reference(calibration: Calibration, margin: float, direction: str | Sequence[float] = "uniform",
                         ) -> np.ndarray:
    """FedHV's reference from a calibration: ``r = max_{s,t} F^{s,t} + margin * m * u``.

    ``u`` is ``direction`` normalised to sum 1; ``"uniform"`` gives the paper's
    ``r = max F + margin`` -- the calibration's own ``reference`` when ``margin`` is the one it was
    computed with (a calibration is shared across margins: its reports do not depend on the margin).
    """
    peak = np.asarray(calibration.max_report, dtype=np.float64)
    if isinstance(direction, str):
        check_direction("fedhv.direction", direction)
        if margin == calibration.margin:
            return np.asarray(calibration.reference, dtype=np.float64)
        return peak + margin
    u = np.asarray(direction, dtype=np.float64)
    if len(u) != len(peak):
        raise ConfigError(f"fedhv.direction has {len(u)} values but the calibration has {len(peak)} tasks; give "
                          "one per task")
    check_direction("fedhv.direction", direction)
    return peak + margin * len(u) * (u / u.sum())


def calibrated_range(calibration: Calibration) -> list[float]:
    """``d_i = r_i - min_{s,t} F_i^{s,t}`` over the calibration rounds.

    How far each task's report fell below its reference during the calibration (its loss scale;
    the scale-free variant's unit of slack).
    """
    rows = [row for rounds in calibration.reports.values() for row in rounds]
    low = [min(row[i] for row in rows) for i in range(len(calibration.reference))]
    return [r - lo for r, lo in zip(calibration.reference, low)]


def slack_scale_values(spec: str | Sequence[float], m: int, calibration: Calibration | None) -> list[float] | None:
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


#: Calibrated ranges differing by more than this factor make FedHV warn before round 1 (issue 40).
SCALE_WARNING = 2.0


def warn_on_scales(ranges: Sequence[float], task_names: Sequence[str]) -> bool:
    """Log one warning when the tasks' calibrated ranges differ by more than :data:`SCALE_WARNING` times.

    Returns whether it warned (never for fewer than two tasks or a non-positive range).
    """
    d = [float(v) for v in ranges]
    if len(d) < 2 or min(d) <= 0 or max(d) / min(d) <= SCALE_WARNING:
        return False
    hi, lo = int(np.argmax(d)), int(np.argmin(d))
    log.warning("fedhv: the tasks' losses moved on different scales during the calibration (range r_i - min F_i: "
                "%s %.3g, %s %.3g, %.1fx > %.0fx): FedHV's paper map weighs raw slacks, so %s gets the least "
                "weight; for tasks on different loss scales set fedhv.slack_scale = \"calibrated-range\" (the "
                "scale-free variant, docs/methods.md)", task_names[hi] if hi < len(task_names) else hi, d[hi],
                task_names[lo] if lo < len(task_names) else lo, d[lo], d[hi] / d[lo], SCALE_WARNING,
                task_names[hi] if hi < len(task_names) else f"task {hi}")
    return True


_H = FedHVConfig
_C = CalibrationConfig


@register
@dataclass(frozen=True)
class FedHV(Method):
    """FedHV (paper §3.3): ``w^{t+1}_i ∝ 1 / max(r_i - F_i^t, rho_clip)`` from averaged client reports.

    The public fields are the ``[fedhv]`` section's (:class:`FedHVConfig`, whose defaults these
    are) and the calibration's (``[calibration]``: ``rounds``, ``margin``, ``seeds``). Defaults:
    ``lr_global = 1.0``, ``reference = None`` (calibrate: ``calibration_rounds = 20``
    uniform-weight rounds with ``calibration_seeds = (0,)``, ``r = max_t F^t + margin``,
    ``margin = 0.15``; ``"paper"``: the paper's Table 6), ``rho_clip = 1e-6``,
    ``report_batches = "all"`` (each client reports over its whole local dataset),
    ``slack_scale = "none"`` (the paper's map; see :func:`fedhv.weighting.hv_weights` for
    ``"calibrated-range"``, the scale-free variant).
    """

    lr_global: float = 1.0
    reference: Sequence[float] | str | None = None
    rho_clip: float = _H.rho_clip
    report_batches: int | str = _H.report_batches
    calibration_rounds: int = _C.rounds
    margin: float = _C.margin
    calibration_seeds: tuple[int, ...] = _C.seeds
    slack_scale: str | Sequence[float] = _H.slack_scale
    direction: str | Sequence[float] = _H.direction
    name: ClassVar[str] = "fedhv"
    section: ClassVar[type] = FedHVConfig
    state: ClassVar[type] = FedHVState
    takes_margin: ClassVar[bool] = True
    #: ``fedhv tune`` searches the reference margin delta_r (``calibration.margin``; paper: 0.15) besides the
    #: learning rates.
    tuning: ClassVar[tuple[Dimension, ...]] = (Range("calibration.margin", 0.03, 0.6, log=True, authors=(0.15,)),)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> FedHV:
        """The FedHV a resolved configuration describes (``[fedhv]``, ``[calibration]``, its rates)."""
        h, c = cfg.section(cls.name), cfg.calibration
        ref = None if h.reference == "calibrate" else h.reference
        return cls(cfg.lr_global, ref, h.rho_clip, h.report_batches, c.rounds, c.margin, tuple(c.seeds),
                   h.slack_scale, h.direction)

    def options(self) -> FedHVConfig:
        """The ``[fedhv]`` section of these options."""
        if self.reference is None or isinstance(self.reference, str):
            ref: str | tuple[float, ...] = "calibrate" if self.reference is None else self.reference
        else:
            ref = tuple(float(v) for v in self.reference)
        scale = self.slack_scale if isinstance(self.slack_scale, str) else tuple(float(v) for v in self.slack_scale)
        aim = self.direction if isinstance(self.direction, str) else tuple(float(v) for v in self.direction)
        return FedHVConfig(self.rho_clip, self.report_batches, ref, scale, aim)

    @classmethod
    def front_overrides(cls, direction: tuple[float, ...], margin: float | None = None) -> tuple[str, ...] | None:
        """Aim the reference: ``r = max F^cal + margin * m * u``.

        The overrides ``fedhv.direction = u`` and ``calibration.margin = margin`` (the calibration itself is
        shared across margins and directions).
        """
        if margin is None:
            raise ConfigError("a FedHV front needs a margin delta > 0 (--margins, e.g. 0.15,0.3)")
        return (f"fedhv.direction={list(direction)!r}", f"calibration.margin={float(margin)!r}")

    def configure(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` running this method: ``method``, its rates, ``[fedhv]`` and the calibration's keys."""
        cfg = super().configure(cfg)
        calibration = dataclasses.replace(cfg.calibration, rounds=self.calibration_rounds, margin=self.margin,
                                          seeds=tuple(self.calibration_seeds))
        return dataclasses.replace(cfg, calibration=calibration)

    def uses_calibration(self) -> bool:
        """Calibrated when no reference is given."""
        return self.reference is None or self.reference == "calibrate"

    def resolve_reference(self, context: BuildContext) -> tuple[np.ndarray, str, Calibration | None]:
        """The training reference ``r``, where it came from, and the calibration behind it.

        Calibrated (paper §3.2, B.8; a given or shared calibration is reused), the paper's Table 6,
        or given: a given or paper reference must hold one value per task above the initial
        model's task losses (``r_i > f_i``, else the weight map has no positive slack).
        """
        m = context.num_tasks
        if self.uses_calibration():
            calibration = context.calibration()
            return calibrated_reference(calibration, self.margin, self.direction), "calibration", calibration
        if self.direction != "uniform":
            raise ConfigError(f"fedhv.direction = {list(self.direction)} aims a calibrated reference, but the reference "
                              "is given; drop the direction or calibrate (reference = None)")
        if self.reference == "paper":
            from fedhv.paper import REFERENCES

            if context.benchmark not in REFERENCES:
                raise ConfigError(f"fedhv.reference = \"paper\": the paper gives no reference for "
                                  f"{context.benchmark!r}; use \"calibrate\" or a list of values")
            ref, source = np.asarray(REFERENCES[context.benchmark], dtype=np.float64), "paper Table 6"
        else:
            assert self.reference is not None and not isinstance(self.reference, str)
            ref, source = np.asarray(self.reference, dtype=np.float64), "given"
        if len(ref) != m:
            raise ConfigError(f"fedhv.reference has {len(ref)} values but {context.benchmark} has {m} tasks "
                              f"({', '.join(context.task_names)}); give one value per task")
        f0 = context.initial_losses()
        bad = [i for i in range(m) if ref[i] - f0[i] <= 0]
        if bad:
            detail = ", ".join(f"r[{i}] = {ref[i]:.4g} <= f[{i}] = {f0[i]:.4g}" for i in bad)
            raise ConfigError(
                f"fedhv.reference gives a non-positive slack at the initial model ({detail}); the weight map "
                "needs r_i > f_i. Raise those entries above the initial losses or use fedhv.reference = \"calibrate\""
            )
        return ref, source, None

    def build(self, context: BuildContext) -> Built:
        """:class:`FedHVAlgorithm` with the resolved reference (and slack scales).

        With a calibration and the paper's map, a warning before round 1 when the tasks' calibrated
        ranges ``d_i = r_i - min_t F_i^t`` differ by more than :data:`SCALE_WARNING` times: the map
        weighs raw slacks, so the task whose loss moves most gets the least weight (docs/methods.md,
        "Tasks whose losses live on different scales"); it names the scale-free variant.
        """
        ref, source, calibration = self.resolve_reference(context)
        if calibration is not None and isinstance(self.slack_scale, str) and self.slack_scale == "none":
            warn_on_scales(calibrated_range(calibration), context.task_names)
        return Built(self.algorithm(ref, calibration), ref.tolist(), source, calibration)

    def algorithm(self, reference: Sequence[float] | np.ndarray, calibration: Calibration | None = None) -> FedHVAlgorithm:
        """:class:`FedHVAlgorithm` for a known ``reference`` (``calibration`` for ``"calibrated-range"``)."""
        scale = slack_scale_values(self.slack_scale, len(reference), calibration)
        return FedHVAlgorithm(np.asarray(reference, dtype=np.float64), self.lr_global, self.rho_clip,
                              self.report_batches,
                              slack_scale=None if scale is None else np.asarray(scale, dtype=np.float64))
