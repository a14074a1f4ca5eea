"""Aggregate metrics of the paper (§5.1, C.1)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def hypervolume(losses: Sequence[float], reference: Sequence[float]) -> float:
    """Hypervolume of one point: ``HV = prod_i max(r_i - l_i, 0)``.

    The paper writes ``HV = prod_i (r^eval_i - l_i)`` with ``r^eval = 3 * 1_m``; a
    loss beyond the reference dominates no volume, hence the clamp at 0.
    """
    return math.prod(max(r - loss, 0.0) for r, loss in zip(reference, losses))


def aggregate_metrics(acc: Sequence[float], loss: Sequence[float], eval_reference: float = 3.0) -> dict[str, float]:
    """MeanAcc, WorstAcc, MeanLoss and HV from per-task accuracy (%) and loss."""
    m = len(acc)
    return {
        "mean_acc": sum(acc) / m,
        "worst_acc": min(acc),
        "mean_loss": sum(loss) / m,
        "hv": hypervolume(loss, [eval_reference] * m),
    }
