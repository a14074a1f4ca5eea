"""A long-lived ClientApp process keeps its node's samples for the next run of the same data
(``fedhv.flower.node.partition_data``): reused across seeds / methods, rebuilt when the data change."""

from __future__ import annotations

import pytest
import torch

from fedhv.experiment.setup import federated_data
from fedhv.flower.node import node_data, partition_data

from helpers import small_config

pytestmark = pytest.mark.needs_data  # every test here reads the real data


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """The same samples for the same client (``parts`` holds the node's own row only)."""
    return (torch.equal(a.train_x, b.train_x) and torch.equal(a.train_y, b.train_y) and a.parts.shape == b.parts.shape
            and a.parts.client == b.parts.client and torch.equal(a.parts[a.parts.client], b.parts[b.parts.client]))


def test_other_seed_and_method_reuse_the_node_samples() -> None:
    a = partition_data(small_config("seed=1", 'method="fedhv"'), 2)
    b = partition_data(small_config("seed=5", 'method="uniform"', "rounds=7"), 2)
    assert b is a  # not loaded again
    assert _same(a, node_data(federated_data(small_config()), 2))


def test_other_partition_client_or_dtype_rebuild() -> None:
    base = partition_data(small_config(), 1)
    for cfg, client in ((small_config("partition.alpha=0.1"), 1), (small_config(), 3),
                        (small_config('dtype="float64"'), 1), (small_config("partition.seed=9"), 1)):
        got = partition_data(cfg, client)
        assert got is not base
        assert _same(got, node_data(federated_data(cfg), client))
        assert got.train_x.dtype == (torch.float64 if cfg.dtype == "float64" else torch.float32)
