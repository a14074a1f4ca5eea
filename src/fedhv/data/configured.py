"""The data a configuration names: the benchmark, its client partition and its device tensors.

``[data]``, ``[partition]``, ``dtype`` and ``device`` of a :class:`~fedhv.config.schema.RunConfig`
decide them; a user benchmark (:mod:`fedhv.data.user`) is partitioned by the same rule.
The composition root (:mod:`fedhv.experiment.setup`, which re-exports these names), Flower
nodes' data files (:mod:`fedhv.data.node_file`) and ``fedhv stats`` read data through here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedhv.config.schema import RunConfig
from fedhv.data.augment import Augment
from fedhv.data.benchmarks import BENCHMARKS, Benchmark, BenchmarkSpec, load_benchmark
from fedhv.data.federated import FederatedData
from fedhv.data.partition import client_sizes, dirichlet_partition, identity_partition
from fedhv.data.user import user_benchmark, user_federated_data
from fedhv.errors import ConfigError

__all__ = ["DTYPES", "check_batch_size", "configured_augment", "federated_data", "load_data", "partition_sizes"]

DTYPES = {"float32": torch.float32, "float64": torch.float64}

def configured_augment(aug: Augment, cfg: RunConfig) -> Augment:
    """The benchmark's training augmentation ``aug`` with ``data.rotation_degrees`` /
    ``data.flip_prob`` overrides applied (``None`` keeps the benchmark's value)."""
    d = cfg.data
    return dataclasses.replace(
        aug,
        rotation_degrees=aug.rotation_degrees if d.rotation_degrees is None else d.rotation_degrees,
        flip_prob=aug.flip_prob if d.flip_prob is None else d.flip_prob,
    )


def partition_sizes(cfg: RunConfig, n: int) -> int | np.ndarray:
    """``samples_per_client``, or with ``partition.sizes = "lognormal"`` one size per client."""
    p = cfg.partition
    if p.sizes == "equal":
        return p.samples_per_client
    return client_sizes(p.clients, p.samples_per_client, p.size_sigma, p.min_samples, p.seed, n)


def load_data(cfg: RunConfig) -> tuple[Benchmark, np.ndarray | list[np.ndarray]]:
    """The benchmark and its client partition: ``[N, S]``, or ``N`` arrays of unequal sizes."""
    d = cfg.data
    bench = load_benchmark(
        d.benchmark,
        root=d.root,
        download=d.download,
        pair_seed=d.pair_seed,
        val_fraction=d.val_fraction,
        val_seed=d.val_seed,
    )
    if d.rotation_degrees is not None or d.flip_prob is not None:
        bench = dataclasses.replace(bench, augment=configured_augment(bench.augment, cfg))
    p = cfg.partition
    if p.by == "identity":
        return bench, identity_parts(cfg, len(bench.train_y))
    strata = bench.strata(p.strata)
    parts = dirichlet_partition(strata, p.clients, partition_sizes(cfg, len(strata)), p.alpha, p.seed)
    return bench, parts


def identity_parts(cfg: RunConfig, n_train: int) -> list[np.ndarray]:
    """``partition.by = "identity"``: the benchmark's identities grouped into clients
    (:func:`fedhv.data.partition.identity_partition`)."""
    d, p = cfg.data, cfg.partition
    spec = BENCHMARKS.get(d.benchmark)
    if not isinstance(spec, BenchmarkSpec) or spec.identities is None:
        with_ids = [name for name in BENCHMARKS.names() if getattr(BENCHMARKS.get(name), "identities", None)]
        raise ConfigError(f"partition.by = \"identity\": {d.benchmark} has no natural identities (benchmarks with "
                          f"them: {', '.join(with_ids)}); use partition.by = \"dirichlet\"")
    ids = spec.identities(d.root)
    if len(ids) != n_train:
        raise ConfigError(f"{d.benchmark}: {len(ids)} identities for {n_train} training samples; rebuild the data")
    return identity_partition(ids, p.clients, p.min_identity_images, p.seed)


def check_batch_size(cfg: RunConfig, largest: int) -> None:
    """Refuse ``train.batch_size`` above the largest client's sample count (one line, before any training).

    With equal sizes :func:`fedhv.config.validation.validate` compares it with
    ``partition.samples_per_client``; with unequal sizes only the partition knows the largest
    client, and a batch larger than every client would only size memory (the batch plan is
    ``[local_steps, batch_size]`` per client whatever the client holds).
    """
    if cfg.train.batch_size > largest:
        raise ConfigError(
            f"train.batch_size = {cfg.train.batch_size} exceeds the largest client's {largest} samples "
            f"(partition.sizes = {cfg.partition.sizes!r}); lower train.batch_size to at most {largest}"
        )


def federated_data(cfg: RunConfig) -> FederatedData:
    """Device tensors of the benchmark and partition (a user benchmark's: :mod:`fedhv.data.user`)."""
    if user_benchmark(cfg.data.benchmark) is not None:
        return user_federated_data(cfg.data.benchmark, cfg.partition, DTYPES[cfg.dtype], cfg.device,
                                   cfg.data.max_test_samples)
    bench, parts = load_data(cfg)
    check_batch_size(cfg, max((len(part) for part in parts), default=0))  # training only (not partition-stats)
    return FederatedData.from_benchmark(
        bench,
        parts,
        dtype=DTYPES[cfg.dtype],
        device=cfg.device,
        augment=cfg.data.augment,
        max_test_samples=cfg.data.max_test_samples,
    )
