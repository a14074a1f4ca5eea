"""Small real-data setups for engine and algorithm tests."""

from __future__ import annotations

import numpy as np
import torch

from fedhv.algorithms import Replies, Request
from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.setup import federated_data

from conftest import SMALL

_CACHE: dict[tuple[str, ...], FederatedData] = {}


def small_config(*overrides: str, setting: str = "multimnist") -> RunConfig:
    return load_config(setting, [*SMALL, *overrides])


def small_data(cfg: RunConfig) -> FederatedData:
    key = (cfg.data.benchmark, cfg.dtype, str(cfg.partition), str(cfg.data.augment))
    if key not in _CACHE:
        _CACHE[key] = federated_data(cfg)
    return _CACHE[key]


class ScriptedFederation:
    """Returns prepared replies and records the requests: isolates server-side logic."""

    def __init__(self, clients: np.ndarray, replies: list[Replies]) -> None:
        self._clients = clients
        self._replies = list(replies)
        self.requests: list[Request] = []
        self.up = 0
        self.down = 0

    @property
    def clients(self) -> np.ndarray:
        return self._clients

    def exchange(self, theta: torch.Tensor, request: Request) -> Replies:
        self.requests.append(request)
        return self._replies.pop(0)

    def count_uplink(self, n: int) -> None:
        self.up += n

    def count_downlink(self, n: int) -> None:
        self.down += n

    def relay(self, down_bytes: int, up_bytes: int) -> None:
        self.down += down_bytes
        self.up += up_bytes
