"""The built-in methods' setup factories, registered in :data:`fedhv.registry.METHODS`.

A setup factory ``(cfg, data, progress, calibration, federation_factory) -> MethodSetup``
builds the configured method's algorithm through the public method objects
(:mod:`fedhv.api.methods`, one construction for both).

FedHV's reference is resolved here: calibrated (paper §3.2, B.8), the paper's
Table 6, or given directly (checked against the task count and the initial losses).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from fedhv import methods as api
from fedhv.algorithms.base import Algorithm
from fedhv.checks import check_heads, head_keys
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult, ProgressFactory, calibrate
from fedhv.experiment.divergence import check_calibration_reports, lr_hint
from fedhv.experiment.loop import FederationFactory
from fedhv.experiment.setup import federated_data, new_model
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.params import ParamLayout, TaskSlices
from fedhv.objectives import nonnegative_losses
from fedhv.paper import REFERENCES
from fedhv.registry import METHODS

#: FedHV and Uniform do not split the model into encoder and heads.
_NO_SLICES = cast(TaskSlices, None)


@dataclass
class MethodSetup:
    """A built algorithm and what was done to build it."""

    algorithm: Algorithm
    reference: list[float] | None = None
    reference_source: str | None = None
    calibration: CalibrationResult | None = None
    #: The reference the diagnostics measure slacks against (``[diagnostics]``): FedHV's own, or for
    #: another method the one a FedHV run of the same setting would use, with its calibration.
    diagnostics_reference: list[float] | None = None
    diagnostics_calibration: CalibrationResult | None = None


def initial_losses(cfg: RunConfig, data: FederatedData, seed: int) -> np.ndarray:
    """Task losses of the initial model over all clients' training samples."""
    model = new_model(cfg, data, seed).eval()
    idx = torch.unique(data.parts.reshape(-1))
    losses, _ = per_sample_losses(model, data.train_x[idx], data.train_y[idx], 2048, data.objective)
    return losses.double().mean(0).cpu().numpy()


def resolve_reference(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
                      calibration: CalibrationResult | None = None,
                      federation_factory: FederationFactory | None = None,
                      ) -> tuple[np.ndarray, str, CalibrationResult | None]:
    """FedHV's training reference ``r`` and where it came from.

    A given ``calibration`` (a resumed run's, or one shared across a grid) is reused
    instead of calibrating again when ``fedhv.reference = "calibrate"``. A calibration,
    given or fresh, whose reports are non-finite or grew more than tenfold is refused
    (:func:`fedhv.experiment.divergence.check_calibration_reports`). A fresh
    calibration runs its rounds through ``federation_factory`` when given (e.g. over
    Flower, whose nodes hold only the training partition).
    """
    m = data.num_tasks
    spec = cfg.fedhv.reference
    if spec == "calibrate" and calibration is not None:
        if len(calibration.reference) != m:
            raise ConfigError(
                f"the given calibration has {len(calibration.reference)} reference values but "
                f"{cfg.data.benchmark} has {m} tasks; calibrate again"
            )
        check_calibration_reports(calibration.reports, calibration.reference, lr_hint(cfg.lr_local, cfg.lr_global),
                                  nonnegative_losses(data.objective, m))
        return np.asarray(calibration.reference), "calibration", calibration
    if spec == "calibrate":
        cal_data = data
        p = cfg.calibration.partition_for(cfg.partition)
        if p != cfg.partition:
            if federation_factory is not None:
                raise ConfigError(
                    f"calibration.partition ({p}) differs from the training partition, which is all the "
                    "federation's clients hold; set fedhv.reference (a list of values or \"paper\"), e.g. from "
                    "a `fedhv run` calibration.json"
                )
            cal_data = federated_data(dataclasses.replace(cfg, partition=p))
        result = calibrate(cfg, cal_data, progress, federation_factory)
        check_calibration_reports(result.reports, result.reference, lr_hint(cfg.lr_local, cfg.lr_global),
                                  nonnegative_losses(data.objective, m))
        return np.asarray(result.reference), "calibration", result
    if spec == "paper":
        if cfg.data.benchmark not in REFERENCES:
            raise ConfigError(
                f"fedhv.reference = \"paper\": the paper gives no reference for {cfg.data.benchmark!r}; "
                "use \"calibrate\" or a list of values"
            )
        ref, source = np.asarray(REFERENCES[cfg.data.benchmark]), "paper Table 6"
    else:
        ref, source = np.asarray(spec, dtype=np.float64), "given"
    if len(ref) != m:
        raise ConfigError(
            f"fedhv.reference has {len(ref)} values but {cfg.data.benchmark} has {m} tasks "
            f"({', '.join(data.task_names)}); give one value per task"
        )
    f0 = initial_losses(cfg, data, cfg.seed)
    bad = [i for i in range(m) if ref[i] - f0[i] <= 0]
    if bad:
        detail = ", ".join(f"r[{i}] = {ref[i]:.4g} <= f[{i}] = {f0[i]:.4g}" for i in bad)
        raise ConfigError(
            f"fedhv.reference gives a non-positive slack at the initial model ({detail}); the weight map "
            "needs r_i > f_i. Raise those entries above the initial losses or use fedhv.reference = \"calibrate\""
        )
    return ref, source, None


@METHODS.register("fedhv")
def _fedhv(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
           calibration: CalibrationResult | None = None,
           federation_factory: FederationFactory | None = None) -> MethodSetup:
    ref, source, cal = resolve_reference(cfg, data, progress, calibration, federation_factory)
    method = api.FedHV(cfg.lr_global, ref.tolist(), cfg.fedhv.rho_clip, cfg.fedhv.report_batches,
                       slack_scale=cfg.fedhv.slack_scale)
    return MethodSetup(method.build(ref.tolist(), _NO_SLICES, cfg.seed, cal), ref.tolist(), source, cal)


@METHODS.register("uniform")
def _uniform(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
             calibration: CalibrationResult | None = None,
             federation_factory: FederationFactory | None = None) -> MethodSetup:
    return MethodSetup(api.Uniform(cfg.lr_global).build(None, _NO_SLICES, cfg.seed))


def _slices(cfg: RunConfig, data: FederatedData) -> TaskSlices:
    """Encoder and head positions of the model (FSMGDA, FedCMOO); a user's module must hold one head
    per task in its ``heads`` submodule (:func:`fedhv.checks.check_heads`)."""
    model = new_model(cfg, data, cfg.seed)
    user = getattr(model, "module", None)
    keys = None
    if isinstance(user, torch.nn.Module) and hasattr(model, "heads_name"):
        check_heads(user, model.heads_name, data.num_tasks, needed=True, explicit=False, task_names=data.task_names)
        keys = head_keys(getattr(user, model.heads_name), data.task_names)
    return TaskSlices.of(ParamLayout.of(model), data.num_tasks, model.head_prefix, keys).to(cfg.device)


@METHODS.register("fsmgda")
def _fsmgda(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
            calibration: CalibrationResult | None = None,
            federation_factory: FederationFactory | None = None) -> MethodSetup:
    return MethodSetup(api.FSMGDA(cfg.lr_global, cfg.fsmgda).build(None, _slices(cfg, data), cfg.seed))


@METHODS.register("fedcmoo")
def _fedcmoo(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
             calibration: CalibrationResult | None = None,
             federation_factory: FederationFactory | None = None) -> MethodSetup:
    return MethodSetup(api.FedCMOO(cfg.lr_global, cfg.fedcmoo).build(None, _slices(cfg, data), cfg.seed))


def add_diagnostics_reference(cfg: RunConfig, data: FederatedData, setup: MethodSetup,
                              progress: ProgressFactory | None = None,
                              calibration: CalibrationResult | None = None) -> None:
    """Set ``setup.diagnostics_reference``: the method's FedHV reference, or -- for a method
    without one -- the reference a FedHV run of this setting would resolve (``fedhv.reference``;
    a calibration runs with FedHV's learning rates ``[lr.fedhv]`` when the setting has them, so a
    Uniform and a FedHV run of one setting measure their slacks against the same ``r``). A given
    ``calibration`` (a resumed run's ``calibration.json``) is reused."""
    if setup.reference is not None:
        setup.diagnostics_reference = list(setup.reference)
        return
    fedhv_cfg = cfg
    rates = cfg.lr.get("fedhv")
    if rates is not None:
        fedhv_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr_global=rates.global_,
                                                                       lr_local=rates.local))
    ref, _, cal = resolve_reference(fedhv_cfg, data, progress, calibration)
    setup.diagnostics_reference = ref.tolist()
    setup.diagnostics_calibration = cal


def build_method(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
                 calibration: CalibrationResult | None = None,
                 federation_factory: FederationFactory | None = None) -> MethodSetup:
    """Build the configured method's algorithm (running calibration if needed and not given;
    its rounds through ``federation_factory`` when given)."""
    return METHODS.get(cfg.method)(cfg, data, progress, calibration, federation_factory)
