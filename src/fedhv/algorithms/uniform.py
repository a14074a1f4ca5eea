"""Uniform scalarisation: fixed ``w_i = 1/m`` on FedHV's single-trajectory update (paper B.6).

With ``report=True`` it is the uniform-weight calibration run of §3.2 and B.8, whose averaged
reports define FedHV's reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from fedhv.algorithms.base import Federation, Request, StepResult, fedavg_step
from fedhv.algorithms.method import BuildContext, Built, Method, register
from fedhv.algorithms.plain import fields, int_from_plain


@dataclass(frozen=True)
class UniformConfig:
    """Uniform has no hyper-parameters: its ``[uniform]`` section is empty."""

    def check(self) -> None:
        """Nothing to check."""


@dataclass(frozen=True)
class UniformState:
    """Uniform keeps no state beyond the task count."""

    num_tasks: int
    kind: ClassVar[str] = "uniform"

    def to_plain(self) -> dict[str, Any]:
        """``{"num_tasks": int}``."""
        return {"num_tasks": int(self.num_tasks)}

    @classmethod
    def from_plain(cls, data: Any) -> UniformState:
        """Inverse of :meth:`to_plain`."""
        d = fields(data, cls.kind, ("num_tasks",))
        return cls(int_from_plain(d["num_tasks"], "uniform num_tasks", minimum=1))


@dataclass(frozen=True)
class UniformAlgorithm:
    """Uniform's round logic: fixed uniform weights; reports only when ``report`` is set (calibration)."""

    lr_global: float
    report: bool = False
    report_batches: int | str = "all"
    name: str = "uniform"

    def init_state(self, num_tasks: int) -> UniformState:
        """The task count (all Uniform keeps)."""
        return UniformState(num_tasks)

    def round(self, state: UniformState, theta: torch.Tensor, federation: Federation) -> StepResult:
        """One stage: model down, update (and, for calibration, the report) up."""
        m = state.num_tasks
        request = Request(report=self.report_batches if self.report else None, train=np.full((1, m), 1.0 / m))
        replies = federation.exchange(theta, request)
        assert replies.deltas is not None
        log: dict = {"weights": [1.0 / m] * m}
        if replies.reports is not None:
            log["report"] = replies.reports.double().mean(0).cpu().tolist()
        return StepResult(fedavg_step(theta, replies.deltas[:, 0], self.lr_global, replies.weights), state, log)


@register
@dataclass(frozen=True)
class Uniform(Method):
    """Uniform scalarisation ``w = 1/m`` (FedAvg on the mean task loss).

    Parameters
    ----------
    lr_global : float
        Server learning rate ``eta_g`` (``[lr.uniform] global``).
    """

    lr_global: float = 1.0
    name: ClassVar[str] = "uniform"
    section: ClassVar[type] = UniformConfig
    state: ClassVar[type] = UniformState

    def build(self, context: BuildContext) -> Built:
        """:class:`UniformAlgorithm` without reports."""
        return Built(UniformAlgorithm(self.lr_global))
