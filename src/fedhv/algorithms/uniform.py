"""Uniform scalarisation: fixed ``w_i = 1/m`` on FedHV's single-trajectory update
(paper B.6). With ``report=True`` it is the uniform-weight calibration run of §3.2
and B.8, whose averaged reports define FedHV's reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhv.algorithms.base import ClientReplies, RoundRequest, StepResult, fedavg_step


@dataclass(frozen=True)
class UniformState:
    """Uniform keeps no state beyond the task count."""

    num_tasks: int


@dataclass(frozen=True)
class Uniform:
    """Fixed uniform weights; reports only when ``report`` is set (calibration)."""

    lr_global: float
    report: bool = False
    report_batches: int | str = "all"
    name: str = "uniform"

    def init_state(self, num_tasks: int) -> UniformState:
        return UniformState(num_tasks)

    def request(self, state: UniformState) -> RoundRequest:
        w = np.full(state.num_tasks, 1.0 / state.num_tasks)
        return RoundRequest(w, send_weights=False, report=self.report, report_batches=self.report_batches)

    def server_step(self, state: UniformState, theta: torch.Tensor, replies: ClientReplies) -> StepResult:
        log: dict = {"weights": [1.0 / state.num_tasks] * state.num_tasks}
        if replies.reports is not None:
            log["report"] = replies.reports.double().mean(0).cpu().tolist()
        return StepResult(fedavg_step(theta, replies.deltas, self.lr_global), state, log)
