"""Small real-data setups for engine and algorithm tests."""

from __future__ import annotations

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
