"""How non-IID a client partition is: total-variation distance of label marginals.

For a benchmark with tasks ``i = 1..m`` let ``J_i`` be task ``i``'s label coordinates:
one coordinate with classes ``0..C_i-1`` for a classification task, the task's binary
attributes ``G_i`` for a multi-label task (CelebA5: eight attributes per task). For a
coordinate ``j`` with values ``v``,

    q_j(v)      = |{s in P   : y_{s,j} = v}| / |P|      (the training pool P the partition draws from)
    p_{k,j}(v)  = |{s in D_k : y_{s,j} = v}| / |D_k|    (client k's samples D_k)
    TV_{k,j}    = 1/2 sum_v |p_{k,j}(v) - q_j(v)|       (binary j: |p_{k,j}(1) - q_j(1)|)
    TV_{k,i}    = (1/|J_i|) sum_{j in J_i} TV_{k,j}

``TV`` lies in [0, 1]: 0 when the client holds the pool's label distribution, 1 when the
two distributions share no label value. The partition's summary is the mean over
clients and tasks ``H = (1/(N m)) sum_k sum_i TV_{k,i}``, with the per-task means
``(1/N) sum_k TV_{k,i}`` and the least IID client ``max_k (1/m) sum_i TV_{k,i}``.

A client of ``S`` samples drawn uniformly from the pool has ``TV > 0`` from sampling
noise alone (about ``sum_v sqrt(q(v)(1 - q(v)) / (2 pi S))`` per coordinate);
:func:`iid_partition` gives that scale for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhv.objectives import MultiLabel
from fedhv.rng import numpy_rng


def _coordinates(objective: object, num_classes: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """Per task, its label coordinates as ``(column of train_y, number of values)``."""
    if isinstance(objective, MultiLabel):
        return [[(a, 2) for a in g] for g in objective.groups]
    return [[(i, c)] for i, c in enumerate(num_classes)]


def client_task_tv(labels: np.ndarray, parts: np.ndarray, objective: object,
                   num_classes: tuple[int, ...]) -> np.ndarray:
    """``TV_{k,i}`` of every client ``k`` and task ``i`` (module docstring).

    Parameters
    ----------
    labels : ndarray, int ``[n, L]``
        Training labels of the pool (``Benchmark.train_y``).
    parts : ndarray, int ``[N, S]``
        Client partition (rows index ``labels``).
    objective : Objective
        The benchmark's objective (a :class:`~fedhv.objectives.MultiLabel` reads attribute groups).
    num_classes : tuple of int
        Classes per task (classification).

    Returns
    -------
    ndarray, float64 ``[N, m]``
    """
    out = np.zeros((len(parts), len(num_classes)))
    for i, coords in enumerate(_coordinates(objective, num_classes)):
        for col, values in coords:
            y = labels[:, col].astype(np.int64)
            q = np.bincount(y, minlength=values) / len(y)
            p = np.stack([np.bincount(y[row], minlength=values) / len(row) for row in parts])
            out[:, i] += 0.5 * np.abs(p - q).sum(axis=1)
        out[:, i] /= len(coords)
    return out


@dataclass(frozen=True)
class Heterogeneity:
    """Summary of :func:`client_task_tv` for one partition.

    Attributes
    ----------
    mean_tv : float
        ``H``, the mean of ``TV_{k,i}`` over clients and tasks.
    max_client_tv : float
        ``max_k`` of the client's mean over tasks.
    task_mean_tv : tuple of float
        Per task, the mean over clients.
    client_tv : tuple of float
        Per client, the mean over tasks.
    """

    mean_tv: float
    max_client_tv: float
    task_mean_tv: tuple[float, ...]
    client_tv: tuple[float, ...]

    @classmethod
    def of(cls, tv: np.ndarray) -> Heterogeneity:
        """Summarise a ``[N, m]`` array of ``TV_{k,i}``."""
        per_client = tv.mean(axis=1)
        return cls(float(tv.mean()), float(per_client.max()), tuple(float(v) for v in tv.mean(axis=0)),
                   tuple(float(v) for v in per_client))


def participation_factor(clients: int, per_round: int) -> float:
    """``chi_N(M) = (N - M) / (M (N - 1))`` (paper §4.1; 0 for ``N = 1``).

    The variance of the mean of ``M`` of ``N`` client vectors drawn without replacement around
    their population mean is ``chi_N(M)`` times their population variance
    ``(1/N) sum_k ||g_k - g||^2`` -- the factor by which partial participation scales the
    heterogeneity ``zeta^2`` in the paper's bound (0 at full participation).
    """
    return 0.0 if clients <= 1 else (clients - per_round) / (per_round * (clients - 1))


def iid_partition(n: int, clients: int, samples_per_client: int | np.ndarray, seed: int) -> np.ndarray | list:
    """``[N, S]`` indices, each row a uniform sample without replacement of ``range(n)``
    (a list of rows of the given sizes when ``samples_per_client`` is one size per client).

    The no-label-skew baseline for :class:`Heterogeneity` (stream ``(seed, "iid-partition")``).
    """
    rng = numpy_rng(seed, "iid-partition")
    if not isinstance(samples_per_client, (int, np.integer)):
        return [rng.choice(n, size=min(int(s), n), replace=False) for s in samples_per_client]
    return np.stack([rng.choice(n, size=min(samples_per_client, n), replace=False) for _ in range(clients)])
