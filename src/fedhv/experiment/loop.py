"""The federated round loop shared by calibration and training runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedhv.algorithms.base import Algorithm
from fedhv.data.federated import FederatedData
from fedhv.experiment.setup import sample_clients
from fedhv.sim.engine import Engine
from fedhv.sim.federation import SimFederation


@dataclass
class RoundRecord:
    """What happened in one round (1-based ``round`` = rounds completed)."""

    round: int
    clients: list[int]
    log: dict[str, Any]
    time_client_s: float
    time_server_s: float
    bytes_down: int
    bytes_up: int
    sync_stages: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "clients": self.clients,
            **self.log,
            "time_client_s": self.time_client_s,
            "time_server_s": self.time_server_s,
            "bytes_down_per_client": self.bytes_down,
            "bytes_up_per_client": self.bytes_up,
            "sync_stages": self.sync_stages,
        }


def run_rounds(
    algorithm: Algorithm,
    engine: Engine,
    data: FederatedData,
    theta: torch.Tensor,
    rounds: int,
    clients_per_round: int,
    seed: int,
    stream: str,
    on_round: Callable[[RoundRecord, torch.Tensor, Any], None] | None = None,
    start_round: int = 0,
    state: Any = None,
) -> tuple[torch.Tensor, Any]:
    """Run ``rounds`` federated rounds from ``theta``.

    Parameters
    ----------
    on_round : callable, optional
        Called after every round with the record, the new model and state.

    Returns
    -------
    theta, state
        Final global model and algorithm state.
    """
    if state is None:
        state = algorithm.init_state(data.num_tasks)
    for t in range(start_round, start_round + rounds):
        clients = sample_clients(seed, stream, t, data.num_clients, clients_per_round)
        federation = SimFederation(engine, clients, t)
        t0 = time.perf_counter()
        result = algorithm.round(state, theta, federation)
        elapsed = time.perf_counter() - t0
        theta, state = result.theta, result.state
        record = RoundRecord(
            t + 1, clients.tolist(), result.log, federation.client_seconds, elapsed - federation.client_seconds,
            federation.bytes_down, federation.bytes_up, federation.stages,
        )
        if on_round is not None:
            on_round(record, theta, state)
    return theta, state
