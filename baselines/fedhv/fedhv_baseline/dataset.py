"""MultiMNIST as a Hugging Face dataset, split with Flower Datasets by the paper's partition.

The images are fedhv's MultiMNIST (paper B.1: two MNIST digits overlaid on a 36 x 36 canvas, resized to
28 x 28), built from local MNIST files (``data-dir`` or ``$FEDHV_DATA``; nothing is downloaded) and cached by
fedhv. The clients are decided by Flower Datasets: the training labels become a ``datasets.Dataset`` with
the joint label ``10 left + right`` (the paper's all-label strata, ``add_joint_label``) and
``FedHVPartitioner`` (the paper's Dirichlet rule as a flwr-datasets ``Partitioner``) hands out partition
``partition-id`` -- exactly the client fedhv's own ``multimnist`` runs use.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from datasets import Dataset

from fedhv.data.benchmarks import Benchmark, load_benchmark
from fedhv.flower.partitioner import FedHVPartitioner, add_joint_label


@lru_cache(maxsize=2)
def benchmark(data_dir: str) -> Benchmark:
    """fedhv's MultiMNIST from the local MNIST files (built once, then read from fedhv's cache)."""
    return load_benchmark("multimnist", root=data_dir or None, download=False)


@lru_cache(maxsize=4)
def partitioner(data_dir: str, num_partitions: int, samples_per_client: int, alpha: float,
                seed: int) -> FedHVPartitioner:
    """The paper's partition of the training labels (a ``row`` column points back into the images)."""
    b = benchmark(data_dir)
    labels = Dataset.from_dict({"left": b.train_y[:, 0].astype(np.int64), "right": b.train_y[:, 1].astype(np.int64),
                                "row": np.arange(len(b.train_y))})
    part = FedHVPartitioner(num_partitions, "joint_label", samples_per_client, alpha, seed)
    part.dataset = add_joint_label(labels, ["left", "right"])
    return part


def _tensors(b: Benchmark, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = b.mean[0], b.std[0]
    images = (torch.from_numpy(x).float().div(255.0) - mean) / std
    return images.unsqueeze(1), torch.from_numpy(y.astype(np.int64))


def load_partition(partition_id: int, num_partitions: int, data_dir: str, samples_per_client: int, alpha: float,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``partition_id``'s images ``[S, 1, 28, 28]`` (normalised) and labels ``[S, 2]``."""
    part = partitioner(data_dir, num_partitions, samples_per_client, alpha, seed)
    rows = np.asarray(part.load_partition(partition_id)["row"], dtype=np.int64)
    b = benchmark(data_dir)
    return _tensors(b, b.train_x[rows], b.train_y[rows])


def load_test(data_dir: str, limit: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split (its first ``limit`` samples when ``limit > 0``)."""
    b = benchmark(data_dir)
    n = len(b.test_y) if limit <= 0 else min(limit, len(b.test_y))
    return _tensors(b, b.test_x[:n], b.test_y[:n])
