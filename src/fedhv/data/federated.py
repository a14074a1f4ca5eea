"""A benchmark as device tensors plus a client partition."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedhv.data.augment import Augment
from fedhv.data.benchmarks import Benchmark
from fedhv.data.parts import ClientParts, RaggedParts
from fedhv.objectives import CLASSIFICATION, Objective
from fedhv.rng import numpy_rng


def to_tensor_images(
    x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype, device: str
) -> torch.Tensor:
    """uint8 ``[n, H, W]`` or ``[n, H, W, C]`` -> normalised ``[n, C, H, W]``:
    ``(x / 255 - mean_c) / std_c``."""
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    m = torch.tensor(mean, dtype=dtype, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=dtype, device=device).view(1, -1, 1, 1)
    return ((t.to(dtype) / 255.0 - m) / s).contiguous()


@dataclass(frozen=True)
class FederatedData:
    """Everything the engines need about the data.

    Attributes
    ----------
    task_names : tuple of str
    num_classes : tuple of int
    train_x : Tensor ``[n, 1, H, W]``, normalised
        The training samples some client holds (:meth:`from_benchmark` converts only those).
    train_y : Tensor, int64 ``[n, m]``
    parts : ClientParts
        Client ``c`` holds the samples ``train_x[parts[c]]`` (:mod:`fedhv.data.parts`: an int64
        tensor ``[N, S]``, or clients of unequal sizes).
    eval_sets : dict
        ``{"test": (x, y), "val": (x, y)}``.
    augment : Augment or None
        Training-batch augmentation (``None`` = off).
    provenance : dict
        The benchmark's data provenance (``Benchmark.provenance``: root, source files with
        sizes and digests, warnings, cache file, samples per split), plus
        ``samples["test_evaluated"]`` when evaluation uses a test subset. Plain JSON.
    """

    task_names: tuple[str, ...]
    num_classes: tuple[int, ...]
    train_x: torch.Tensor
    train_y: torch.Tensor
    parts: ClientParts
    eval_sets: dict[str, tuple[torch.Tensor, torch.Tensor]]
    augment: Augment | None
    objective: Objective = CLASSIFICATION
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    @property
    def num_clients(self) -> int:
        return int(self.parts.shape[0])

    def sampleable(self) -> np.ndarray | None:
        """Ids of the clients with samples when some client is empty, else ``None`` (all are)."""
        if isinstance(self.parts, torch.Tensor):
            return None if self.parts.shape[-1] > 0 else np.zeros(0, np.int64)
        sizes = np.array([len(self.parts[c]) for c in range(self.num_clients)])
        return None if bool((sizes > 0).all()) else np.flatnonzero(sizes > 0)

    @classmethod
    def from_benchmark(
        cls,
        bench: Benchmark,
        parts: np.ndarray | list[np.ndarray],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        augment: bool = True,
        max_test_samples: int = 0,
    ) -> FederatedData:
        def images(x: np.ndarray) -> torch.Tensor:
            return to_tensor_images(x, bench.mean, bench.std, dtype, device)

        def labels(y: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(y)).to(device)

        test_x, test_y = bench.test_x, bench.test_y
        if max_test_samples and max_test_samples < len(test_x):
            # A seeded random subset: some sources (image folders) are sorted by class.
            keep = np.sort(numpy_rng(0, "test-subset").permutation(len(test_x))[:max_test_samples])
            test_x, test_y = test_x[keep], test_y[keep]
        provenance = dict(bench.provenance)
        if provenance and len(test_x) != len(bench.test_x):
            provenance["samples"] = {**provenance.get("samples", {}), "test_evaluated": len(test_x)}
        # Only the samples the partition holds become normalised tensors, in their order in the
        # benchmark (``used`` is sorted, so every client's samples keep their order and every
        # draw through ``parts`` is unchanged): 3 clients x 64 samples of MultiMNIST are 192
        # images instead of 60,000 (0.6 s and 620 MB in float64).
        ragged = isinstance(parts, list)  # unequal client sizes (partition.sizes = "lognormal")
        used = np.unique(np.concatenate(parts) if ragged else parts)
        train_x, train_y = bench.train_x, bench.train_y
        if len(used) < len(train_x):
            train_x, train_y = train_x[used], train_y[used]
            parts = [np.searchsorted(used, r) for r in parts] if ragged else np.searchsorted(used, parts)
        if ragged:
            client_rows: ClientParts = RaggedParts([torch.from_numpy(np.ascontiguousarray(r, dtype=np.int64)).to(device)
                                            for r in parts])
        else:
            client_rows = torch.from_numpy(np.ascontiguousarray(parts, dtype=np.int64)).to(device)
        return cls(
            task_names=bench.task_names,
            num_classes=bench.num_classes,
            train_x=images(train_x),
            train_y=labels(train_y),
            parts=client_rows,
            eval_sets={"test": (images(test_x), labels(test_y)), "val": (images(bench.val_x), labels(bench.val_y))},
            augment=bench.augment if augment and bench.augment.active else None,
            objective=bench.objective,
            provenance=provenance,
        )
