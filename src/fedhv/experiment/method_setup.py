"""The composition of a run's method: the configured method class, built against this run.

:func:`build_method` looks the method up by name (:data:`fedhv.registry.METHODS`: the built-ins
and any registered or installed method class), makes its object from the configuration
(:meth:`fedhv.Method.from_config`) and builds it (:meth:`fedhv.Method.build`) with a
:class:`RunContext`, this run's implementation of :class:`fedhv.algorithms.method.BuildContext`:
the task count and seed, the encoder / head split, the initial losses and the reference
calibration (paper §3.2, B.8: a given or shared one is checked and reused, otherwise one is run,
through ``federation_factory`` when given).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedhv.algorithms.base import Algorithm
from fedhv.algorithms.fedhv import FedHV
from fedhv.algorithms.method import Method
from fedhv.checks import check_heads, head_keys
from fedhv.config.schema import CALIBRATION_METHOD, RunConfig
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment.calibration import CalibrationResult, ProgressFactory, calibrate
from fedhv.experiment.divergence import check_calibration_reports, lr_hint
from fedhv.experiment.loop import FederationFactory
from fedhv.experiment.problem import Problem
from fedhv.metrics.evaluate import per_sample_losses
from fedhv.models.params import ParamLayout, TaskSlices
from fedhv.objectives import nonnegative_losses
from fedhv.registry import METHODS


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
    #: The method class's Table 12 description, when it declares one (``Method.complexity``).
    complexity: tuple[str, str, str] | None = None
    #: The method class's name in tables (``Method.label``).
    label: str | None = None


def initial_losses(cfg: RunConfig, data: FederatedData, seed: int, problem: Problem | None = None) -> np.ndarray:
    """Task losses of the initial model over all clients' training samples."""
    model = (problem if problem is not None else Problem.of(cfg)).model(cfg, data, seed).eval()
    idx = torch.unique(data.parts.reshape(-1))
    losses, _ = per_sample_losses(model, data.train_x[idx], data.train_y[idx], 2048, data.objective)
    return losses.double().mean(0).cpu().numpy()


@dataclass
class RunContext:
    """This run's :class:`~fedhv.algorithms.method.BuildContext`: what a method may ask for while it
    is built. Each service runs at most once and only when asked (a method that needs no encoder /
    head split never builds a model for one; no calibration runs unless a method asks for it)."""

    cfg: RunConfig
    data: FederatedData
    progress: ProgressFactory | None = None
    given_calibration: CalibrationResult | None = None
    federation_factory: FederationFactory | None = None
    problem: Problem | None = None
    _calibration: CalibrationResult | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.problem is None:
            self.problem = Problem.of(self.cfg)

    @property
    def num_tasks(self) -> int:
        return self.data.num_tasks

    @property
    def task_names(self) -> tuple[str, ...]:
        return tuple(self.data.task_names)

    @property
    def seed(self) -> int:
        return self.cfg.seed

    @property
    def benchmark(self) -> str:
        return self.cfg.data.benchmark

    def task_slices(self) -> TaskSlices:
        """Encoder and head positions of the model; a user's module must hold one head per task in
        its ``heads`` submodule (:func:`fedhv.checks.check_heads`)."""
        cfg, data = self.cfg, self.data
        assert self.problem is not None
        model = self.problem.model(cfg, data, cfg.seed)
        user = getattr(model, "module", None)
        keys = None
        if isinstance(user, torch.nn.Module) and hasattr(model, "heads_name"):
            check_heads(user, model.heads_name, data.num_tasks, needed=True, explicit=False,
                        task_names=data.task_names)
            keys = head_keys(getattr(user, model.heads_name), data.task_names)
        return TaskSlices.of(ParamLayout.of(model), data.num_tasks, model.head_prefix, keys).to(cfg.device)

    def initial_losses(self) -> np.ndarray:
        return initial_losses(self.cfg, self.data, self.cfg.seed, self.problem)

    def calibration(self) -> CalibrationResult:
        """The given calibration (a resumed run's, or one shared across a grid), checked; else a fresh
        one on ``calibration.partition_*`` (run through ``federation_factory`` when given). Either is
        refused when its reports are non-finite or grew more than tenfold
        (:func:`fedhv.experiment.divergence.check_calibration_reports`)."""
        if self._calibration is not None:
            return self._calibration
        cfg, data, m = self.cfg, self.data, self.data.num_tasks
        result = self.given_calibration
        if result is not None and len(result.reference) != m:
            raise ConfigError(f"the given calibration has {len(result.reference)} reference values but "
                              f"{cfg.data.benchmark} has {m} tasks; calibrate again")
        if result is None:
            cal_data = data
            p = cfg.calibration.partition_for(cfg.partition)
            if p != cfg.partition:
                if self.federation_factory is not None:
                    raise ConfigError(
                        f"calibration.partition ({p}) differs from the training partition, which is all the "
                        "federation's clients hold; set fedhv.reference (a list of values or \"paper\"), e.g. "
                        "from a `fedhv run` calibration.json"
                    )
                assert self.problem is not None
                cal_data = self.problem.data(dataclasses.replace(cfg, partition=p))
            result = calibrate(cfg, cal_data, self.progress, self.federation_factory, self.problem)
        check_calibration_reports(result.reports, result.reference, lr_hint(cfg.lr_local, cfg.lr_global),
                                  nonnegative_losses(data.objective, m))
        self._calibration = result
        return result


def method_of(cfg: RunConfig) -> Method:
    """The configured method's object (its class looked up by ``method``, its options from the config)."""
    method: Method = METHODS.get(cfg.method).from_config(cfg)
    return method


def resolve_reference(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
                      calibration: CalibrationResult | None = None,
                      federation_factory: FederationFactory | None = None, problem: Problem | None = None,
                      ) -> tuple[np.ndarray, str, CalibrationResult | None]:
    """FedHV's training reference ``r`` for ``cfg`` (``[fedhv]``, ``[calibration]``), where it came
    from, and the calibration behind it (:meth:`fedhv.algorithms.fedhv.FedHV.resolve_reference`)."""
    context = RunContext(cfg, data, progress, calibration, federation_factory, problem)
    ref, source, cal = FedHV.from_config(cfg).resolve_reference(context)
    return ref, source, cal  # type: ignore[return-value]


def add_diagnostics_reference(cfg: RunConfig, data: FederatedData, setup: MethodSetup,
                              progress: ProgressFactory | None = None,
                              calibration: CalibrationResult | None = None, problem: Problem | None = None) -> None:
    """Set ``setup.diagnostics_reference``: the method's FedHV reference, or -- for a method
    without one -- the reference a FedHV run of this setting would resolve (``fedhv.reference``;
    a calibration runs with FedHV's learning rates ``[lr.fedhv]`` when the setting has them, so a
    Uniform and a FedHV run of one setting measure their slacks against the same ``r``). A given
    ``calibration`` (a resumed run's ``calibration.json``) is reused."""
    if setup.reference is not None:
        setup.diagnostics_reference = list(setup.reference)
        return
    fedhv_cfg = cfg
    rates = cfg.lr.get(CALIBRATION_METHOD)
    if rates is not None:
        fedhv_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lr_global=rates.global_,
                                                                       lr_local=rates.local))
    ref, _, cal = resolve_reference(fedhv_cfg, data, progress, calibration, problem=problem)
    setup.diagnostics_reference = ref.tolist()
    setup.diagnostics_calibration = cal


def build_method(cfg: RunConfig, data: FederatedData, progress: ProgressFactory | None = None,
                 calibration: CalibrationResult | None = None,
                 federation_factory: FederationFactory | None = None, method: Any = None,
                 problem: Problem | None = None) -> MethodSetup:
    """Build the configured method's algorithm (or ``method``'s, the object a caller passes through)
    against this run's ``problem`` (running a calibration if it asks for one and none is given; its
    rounds through ``federation_factory`` when given)."""
    context = RunContext(cfg, data, progress, calibration, federation_factory, problem)
    method = method if method is not None else method_of(cfg)
    built = method.build(context)
    return MethodSetup(built.algorithm, None if built.reference is None else list(built.reference),
                       built.reference_source, built.calibration,  # type: ignore[arg-type]
                       complexity=type(method).complexity, label=type(method).label)
