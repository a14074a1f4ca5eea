"""The server-client protocol types shared by algorithms and engines.

An algorithm is pure round logic with explicit state: it tells the engine what
each sampled client must compute (:class:`RoundRequest`), and turns the clients'
replies (:class:`ClientReplies`) into the next global model and state. Engines
(simulator, Flower) execute requests without knowing which algorithm sent them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class RoundRequest:
    """What every sampled client computes in one round.

    Attributes
    ----------
    weights : ndarray ``[m]``
        Task weights ``w`` of the local objective ``sum_i w_i l_i``.
    send_weights : bool
        Whether ``w`` travels with the model downlink (counted in the bytes).
    report : bool
        Evaluate the ``m`` task losses at the received model before training.
    report_batches : int or "all"
        Report budget ``B_rep``.
    """

    weights: np.ndarray
    send_weights: bool
    report: bool
    report_batches: int | str = "all"


@dataclass
class ClientReplies:
    """Stacked replies of the ``k`` sampled clients.

    Attributes
    ----------
    clients : ndarray, int ``[k]``
        Client ids, in reply order.
    deltas : Tensor ``[k, d]``
        Model updates ``Delta theta_k = theta_k^K - theta^t``.
    reports : Tensor ``[k, m]`` or None
        Task losses at ``theta^t``.
    """

    clients: np.ndarray
    deltas: torch.Tensor
    reports: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """Outcome of the server step: new model, new state, and per-round log values."""

    theta: torch.Tensor
    state: Any
    log: dict[str, Any]


class Algorithm(Protocol):
    """Round logic of one federated method."""

    @property
    def name(self) -> str:
        """Method name (as in ``method = ...``)."""

    def init_state(self, num_tasks: int) -> Any:
        """State before round 0."""

    def request(self, state: Any) -> RoundRequest:
        """What the sampled clients must compute this round."""

    def server_step(self, state: Any, theta: torch.Tensor, replies: ClientReplies) -> StepResult:
        """Aggregate replies into ``theta^{t+1}`` and the next state."""


def fedavg_step(theta: torch.Tensor, deltas: torch.Tensor, lr_global: float) -> torch.Tensor:
    """``theta + eta_g * (1/|S|) sum_k Delta theta_k``."""
    return theta + lr_global * deltas.mean(0)
