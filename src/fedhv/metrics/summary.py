"""Aggregate metrics of the paper (§5.1, C.1), over tasks of any kind."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

#: The paper's evaluation reference ``r^eval_i = 3`` (C.1), the default HV offset.
PAPER_HV_REFERENCE = 3.0


#: The evaluation fields ``summary.json`` copies from the final evaluation (also ``History.evaluations``).
SUMMARY_EVAL_KEYS = ("mean_acc", "worst_acc", "mean_loss", "hv", "task_acc", "task_loss", "task_score")


def hypervolume(losses: Sequence[float], reference: Sequence[float]) -> float:
    """Hypervolume of one point: ``HV = prod_i max(r_i - l_i, 0)``.

    The paper writes ``HV = prod_i (r^eval_i - l_i)`` with ``r^eval = 3 * 1_m``; a
    loss beyond the reference dominates no volume, hence the clamp at 0.
    """
    return math.prod(max(r - loss, 0.0) for r, loss in zip(reference, losses))


def hv_reference(value: float | Sequence[float], m: int) -> list[float]:
    """The per-task HV reference ``r^eval`` from one offset for all tasks or one per task."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ref = [float(value)] * m
    else:
        ref = [float(v) for v in cast("Sequence[float]", value)]  # a bool fails here as before (not iterable)
    if len(ref) != m or not all(math.isfinite(v) for v in ref):
        raise ValueError(f"hv_reference = {value!r} must be one finite number or {m} finite numbers (one per task)")
    return ref


def list_or_float(value: float | Sequence[float]) -> float | list[float]:
    """A configured HV offset as a float or a list (configuration tuples become lists)."""
    return value if isinstance(value, (int, float)) else [float(v) for v in value]


def aggregate_metrics(acc: Sequence[float | None], loss: Sequence[float],
                      eval_reference: float | Sequence[float] = PAPER_HV_REFERENCE) -> dict[str, Any]:
    """MeanAcc, WorstAcc, MeanLoss and HV from per-task accuracy (%) and loss.

    ``acc[i] = None`` marks a task without an accuracy (a regression task): MeanAcc and
    WorstAcc are over the others (``None`` when no task has one); MeanLoss and
    ``HV = prod_i max(r_i - l_i, 0)`` are over all tasks, with ``r = eval_reference``
    (one offset for every task, or one per task).
    """
    m = len(loss)
    real = [a for a in acc if a is not None]
    return {
        "mean_acc": sum(real) / len(real) if real else None,
        "worst_acc": min(real) if real else None,
        "mean_loss": sum(loss) / m,
        "hv": hypervolume(loss, hv_reference(eval_reference, m)),
    }


def task_metrics(scores: Sequence[float], loss: Sequence[float], metrics: Sequence[Any],
                 eval_reference: float | Sequence[float] = PAPER_HV_REFERENCE) -> dict[str, Any]:
    """One evaluation's record fields from mean per-sample scores and losses.

    Parameters
    ----------
    scores, loss : sequence of float
        Mean per-sample score and loss of each task.
    metrics : sequence of TaskMetric
        Each task's metric (:class:`fedhv.objectives.TaskMetric`: name, direction, whether it
        is an accuracy, scale).
    eval_reference : float or sequence of float
        HV offsets ``r^eval``.

    Returns
    -------
    dict
        ``task_score`` (each task's score in its metric's units: % for accuracies),
        ``task_acc`` (the accuracy in %, ``None`` for a task without one), ``task_loss`` and
        :func:`aggregate_metrics`' fields.
    """
    shown = [s * mt.scale for s, mt in zip(scores, metrics)]
    acc = [v if mt.is_accuracy else None for v, mt in zip(shown, metrics)]
    return {**aggregate_metrics(acc, loss, eval_reference), "task_acc": acc, "task_loss": list(loss),
            "task_score": shown}
