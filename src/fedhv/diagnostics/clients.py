"""Every client's per-task loss and score on its own data, and the fairness summaries of them.

For client ``k`` with local samples ``D_k`` (its partition row, eval mode, no augmentation)::

    f_i^(k)(theta) = mean_{j in D_k} l_i(theta; x_j, y_j),    a_i^(k) = mean_{j in D_k} score_i(x_j, y_j).

The full-population objective of the paper's analysis (A.2, equal client weights) is
``f_i(theta) = (1/N) sum_k f_i^(k)(theta)`` over the ``N`` clients that hold samples (an empty
client has no objective). Every sample is forwarded once even when several clients hold it
(the partition recycles samples when strata run dry); the cost is one forward pass over the
distinct training samples the partition holds.

The fairness summaries per task (what q-FFL, AFL and TERM report over clients) are over the
non-empty clients' scores ``a^(k)``: the mean, the worst client (the minimum for a score where
higher is better, else the maximum), the 10th percentile from the bad side, the standard
deviation (population, ``ddof = 0``), the best client, and Jain's index
``J = (sum_k a_k)^2 / (N sum_k a_k^2)`` in ``[1/N, 1]`` (1 = every client equal; computed for
non-negative scores only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from fedhv.data.federated import FederatedData
from fedhv.data.parts import ClientParts
from fedhv.metrics.evaluate import per_sample_losses, task_metric_list


def membership(parts: ClientParts, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, owner, sizes)``: every (client, sample) pair of the partition, flat.

    ``rows[j]`` is a sample index held by client ``owner[j]``; ``sizes[k]`` = samples of client ``k``.
    Works for the equal-size ``[N, S]`` tensor and for :class:`~fedhv.data.parts.RaggedParts` (:class:`~fedhv.data.parts.ClientParts`).
    """
    if isinstance(parts, torch.Tensor):
        n, s = (int(parts.shape[0]), int(parts.shape[1])) if parts.ndim == 2 else (int(parts.shape[0]), 0)
        rows = parts.reshape(-1).to(device)
        sizes = torch.full((n,), s, dtype=torch.int64, device=device)
    else:
        sizes = torch.tensor([len(parts[c]) for c in range(len(parts))], dtype=torch.int64, device=device)
        rows = parts.reshape(-1).to(device) if int(sizes.sum()) else torch.zeros(0, dtype=torch.int64, device=device)
    owner = torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes)
    return rows, owner, sizes


@torch.no_grad()
def client_means(model: nn.Module, data: FederatedData, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-client mean loss and score of every task (``model`` evaluated in eval mode).

    Returns
    -------
    loss, score : ndarray ``[N, m]`` (float64)
        ``f_i^(k)`` and ``a_i^(k)`` (the score in its metric's units: % for accuracies);
        ``nan`` rows for empty clients.
    sizes : ndarray ``[N]``
    """
    was_training = model.training
    model.eval()
    try:
        losses, scores = per_sample_losses(model, data.train_x, data.train_y, batch_size, data.objective)
    finally:
        model.train(was_training)
    rows, owner, sizes = membership(data.parts, losses.device)
    m = losses.shape[1]
    n = len(sizes)
    sums = torch.zeros(n, 2 * m, dtype=torch.float64, device=losses.device)
    both = torch.cat([losses, scores], 1).double()
    sums.index_add_(0, owner, both[rows])
    counts = sizes.double().unsqueeze(1)
    means = (sums / counts).cpu().numpy()  # 0/0 = nan for an empty client
    scale = np.array([mt.scale for mt in task_metric_list(data.objective, m)])
    return means[:, :m], means[:, m:] * scale, sizes.cpu().numpy()


def population_objective(loss: np.ndarray) -> np.ndarray:
    """``f(theta) = mean_k f^(k)(theta)`` over the clients with samples (paper A.2, equal weights)."""
    return np.nanmean(loss, axis=0)


def jain_index(values: np.ndarray) -> float | None:
    """``(sum x)^2 / (n sum x^2)``; ``None`` for an empty, negative or all-zero input."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0 or (x < 0).any() or not (x > 0).any():
        return None
    return float(x.sum() ** 2 / (len(x) * (x * x).sum()))


def fairness_summary(values: np.ndarray, higher_is_better: bool) -> dict[str, float | None]:
    """Mean, worst client, 10th percentile from the bad side, std, best client and Jain's index."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return {"mean": None, "worst": None, "p10": None, "std": None, "best": None, "jain": None}
    return {
        "mean": float(x.mean()),
        "worst": float(x.min() if higher_is_better else x.max()),
        "p10": float(np.percentile(x, 10 if higher_is_better else 90)),
        "std": float(x.std()),
        "best": float(x.max() if higher_is_better else x.min()),
        "jain": jain_index(x),
    }


def client_fairness(loss: np.ndarray, score: np.ndarray, objective: Any) -> dict[str, list[dict[str, Any]]]:
    """Per task: the fairness summary of the clients' scores and of their losses (lower is better)."""
    metrics = task_metric_list(objective, loss.shape[1])
    return {
        "score": [fairness_summary(score[:, i], mt.higher_is_better) for i, mt in enumerate(metrics)],
        "loss": [fairness_summary(loss[:, i], False) for i in range(loss.shape[1])],
    }
