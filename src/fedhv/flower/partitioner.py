"""fedhv's paper partition for Flower users: a Flower Datasets ``Partitioner`` (issue 42).

:class:`FedHVPartitioner` is :func:`fedhv.data.partition.dirichlet_partition` -- the paper's rule (B.2,
the reference code's ``dirichlet_all_labels``): every client draws its own label mix
``p ~ Dir(alpha 1_K)`` over the ``K`` strata and gets ``floor(p_k S)`` samples of stratum ``k``, topped up
to exactly ``S``, re-using samples when a stratum runs dry -- as a ``flwr_datasets`` partitioner, so a
Flower user's own ``ClientApp`` loads exactly the clients fedhv's presets use:

>>> from flwr_datasets import FederatedDataset                       # doctest: +SKIP
>>> part = FedHVPartitioner(num_partitions=100, partition_by="joint_label", samples_per_client=500)
>>> fds = FederatedDataset(dataset=..., partitioners={"train": part})  # doctest: +SKIP

The paper's "all-label" strata are the joint label of every task, ``sum_i y_i prod_{j>i} C_j``
(``10 L + R`` for two 10-class tasks; for binary attributes the code ``sum_a y_a 2^(A-1-a)``):
:func:`add_joint_label` writes it as a column. ``pip install 'fedhv[hf]'``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasets import ClassLabel, Dataset
from flwr_datasets.partitioner import Partitioner

from fedhv.data.partition import dirichlet_partition
from fedhv.errors import ConfigError

#: The column :func:`add_joint_label` writes by default.
JOINT = "joint_label"


def add_joint_label(dataset: Dataset, columns: Sequence[str], sizes: Sequence[int] | None = None,
                    name: str = JOINT) -> Dataset:
    """``dataset`` with the joint label of ``columns`` as column ``name``: ``sum_i y_i prod_{j>i} C_j``.

    ``C_j`` is ``sizes[j]``, else a ``ClassLabel`` column's ``num_classes``, else the column's
    ``max + 1`` (a 0/1 attribute: 2). Labels must be integers in ``0..C_j - 1``. The code is
    fedhv's ``Benchmark.strata("all-label")`` for classification tasks and ``"all-attributes"``
    for binary attributes (attributes in ascending index order, the first most significant).
    """
    if not columns:
        raise ConfigError("columns = [] is empty; name the label columns whose joint label makes the strata")
    if sizes is not None and len(sizes) != len(columns):
        raise ConfigError(f"sizes has {len(sizes)} values for {len(columns)} columns; give one per column")
    if name in dataset.column_names:
        raise ConfigError(f"the dataset already has a column {name!r}; pass another name=")
    code = np.zeros(len(dataset), dtype=np.int64)
    for j, col in enumerate(columns):
        if col not in dataset.column_names:
            raise ConfigError(f"column {col!r} is not in the dataset (columns: {', '.join(dataset.column_names)})")
        y = np.asarray(dataset[col])
        if y.dtype.kind not in "iub" or y.ndim != 1:
            raise ConfigError(f"column {col!r} holds {y.dtype} values; the joint label needs one integer label per row")
        y = y.astype(np.int64)
        feature = dataset.features[col]
        size = (sizes[j] if sizes is not None else int(feature.num_classes) if isinstance(feature, ClassLabel)
                else int(y.max()) + 1)
        if y.min() < 0 or y.max() >= size:
            raise ConfigError(f"column {col!r} has labels in {int(y.min())}..{int(y.max())}, outside 0..{size - 1}")
        if code.max(initial=0) > (np.iinfo(np.int64).max - size) // max(size, 1):
            raise ConfigError(f"the joint label of {list(columns)} does not fit in 63 bits; use fewer columns")
        code = code * size + y
    return dataset.add_column(name, code)


class FedHVPartitioner(Partitioner):
    """The paper's partition (:func:`fedhv.data.partition.dirichlet_partition`) as a Flower Datasets partitioner.

    Parameters
    ----------
    num_partitions : int
        Clients ``N``.
    partition_by : str
        The strata column (integer labels), e.g. :data:`JOINT` from :func:`add_joint_label`.
    samples_per_client : int or sequence of int
        Exact client size ``S``, or one size per client.
    alpha : float
        Dirichlet concentration (the paper's presets: 0.5).
    seed : int
        Partition seed (the presets': 10).
    """

    def __init__(self, num_partitions: int, partition_by: str, samples_per_client: int | Sequence[int],
                 alpha: float = 0.5, seed: int = 10) -> None:
        super().__init__()
        if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
            raise ConfigError(f"num_partitions = {num_partitions!r} must be an integer >= 1")
        if not alpha > 0:
            raise ConfigError(f"alpha = {alpha} must be > 0 (the paper's presets: 0.5)")
        sizes = np.asarray(samples_per_client)
        if (sizes.ndim == 0 and not int(sizes) >= 1) or (sizes.ndim == 1 and (len(sizes) != num_partitions
                                                                             or (sizes < 1).any())):
            raise ConfigError(f"samples_per_client = {samples_per_client!r} must be an integer >= 1 or one such size "
                              f"per partition ({num_partitions})")
        self._num_partitions = num_partitions
        self._partition_by = partition_by
        self._sizes: int | np.ndarray = int(sizes) if sizes.ndim == 0 else sizes.astype(np.int64)
        self._alpha = float(alpha)
        self._seed = int(seed)
        self._rows: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        """Total number of partitions (clients)."""
        return self._num_partitions

    @property
    def partition_rows(self) -> list[np.ndarray]:
        """Client ``c``'s row indices into the dataset (computed once, on first use)."""
        if self._rows is None:
            if self._partition_by not in self.dataset.column_names:
                raise ConfigError(f"partition_by column {self._partition_by!r} is not in the dataset (columns: "
                                  f"{', '.join(self.dataset.column_names)}); add it, e.g. with add_joint_label")
            strata = np.asarray(self.dataset[self._partition_by])
            if strata.dtype.kind not in "iub" or strata.ndim != 1:
                raise ConfigError(f"partition_by column {self._partition_by!r} holds {strata.dtype} values; the strata "
                                  "must be one integer label per row")
            parts = dirichlet_partition(strata.astype(np.int64), self._num_partitions, self._sizes, self._alpha,
                                        self._seed)
            self._rows = [np.asarray(parts[c], dtype=np.int64) for c in range(self._num_partitions)]
        return self._rows

    def load_partition(self, partition_id: int) -> Dataset:
        """Client ``partition_id``'s rows (a row may appear in several clients, as in the paper)."""
        if not 0 <= partition_id < self._num_partitions:
            raise ConfigError(f"partition_id = {partition_id} is outside 0..{self._num_partitions - 1}")
        return self.dataset.select(self.partition_rows[partition_id])
