"""Batched evaluation of a multi-task model (eval mode: no dropout, no augmentation)."""

from __future__ import annotations

import torch
from torch import nn

from fedhv.models.inference import inference_forward
from fedhv.objectives import ACCURACY, CLASSIFICATION, Objective, TaskMetric


@torch.no_grad()
def per_sample_losses(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096,
    objective: Objective = CLASSIFICATION, rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample task losses and correctness (model in its current mode).

    Parameters
    ----------
    model : nn.Module
        Called as ``model(x_chunk)``; for the built-in CNNs in float32 on the CPU the
        same outputs come from :func:`fedhv.models.inference.inference_forward` (oneDNN
        layout, chunks of a few hundred samples).
    x, y : Tensor
        Inputs ``[N, ...]`` and labels ``[N, ...]``.
    batch_size : int
        Most samples per forward (memory bound).
    objective : Objective
    rows : Tensor, int64 ``[n]``, optional
        Evaluate rows ``x[rows]`` (in this order) instead of all of ``x``; gathered one
        chunk at a time, so the ``n`` samples are never copied as a whole.

    Returns
    -------
    losses : Tensor ``[n, m]``
    correct : Tensor ``[n, m]``
        1/0 for classification, the fraction of correct attributes for multi-label tasks.
        Row ``j`` belongs to sample ``j`` (``x[rows[j]]`` with ``rows``).
    """
    fast = inference_forward(model, x)
    forward, chunk = (model, batch_size) if fast is None else (fast[0], min(batch_size, fast[1]))
    n = len(x) if rows is None else len(rows)
    losses, correct = [], []
    for start in range(0, n, chunk):
        if rows is None:
            xb, yb = x[start : start + chunk], y[start : start + chunk]
        else:
            idx = rows[start : start + chunk]
            xb, yb = x[idx], y[idx]
        loss, corr = objective.per_sample(forward(xb), yb)
        losses.append(loss)
        correct.append(corr)
    return torch.cat(losses), torch.cat(correct)


def task_metric_list(objective: Objective, m: int) -> list[TaskMetric]:
    """Each task's :class:`~fedhv.objectives.TaskMetric` (the built-in objectives: accuracies)."""
    return list(getattr(objective, "metrics", None) or [ACCURACY] * m)


def describe_metrics(task_names: tuple[str, ...] | list[str], objective: Objective) -> list[dict]:
    """``summary.json``'s ``task_metrics``: per task its name, metric, direction and MeanAcc membership."""
    metrics = task_metric_list(objective, len(task_names))
    return [{"task": name, **mt.as_dict()} for name, mt in zip(task_names, metrics)]


def evaluate_means(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096,
    objective: Objective = CLASSIFICATION,
) -> tuple[list[float], list[float]]:
    """Mean per-sample score and loss of each task over a whole evaluation set (eval mode).

    Runs on the device of ``model`` and ``x``; the returned Python floats are copied
    from the device, so the call returns only after the device finished (a clock read
    right after it includes all of the evaluation's GPU work).
    """
    was_training = model.training
    model.eval()
    try:
        losses, scores = per_sample_losses(model, x, y, batch_size, objective)
    finally:
        model.train(was_training)
    return scores.double().mean(0).tolist(), losses.double().mean(0).tolist()


def evaluate_tasks(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096,
    objective: Objective = CLASSIFICATION,
) -> tuple[list[float], list[float]]:
    """Per-task score in its metric's units (accuracy in %) and mean loss over a whole set."""
    scores, loss = evaluate_means(model, x, y, batch_size, objective)
    metrics = task_metric_list(objective, len(loss))
    return [s * mt.scale for s, mt in zip(scores, metrics)], loss


def evaluate_record(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, objective: Objective,
    eval_reference: float | list[float],
) -> dict:
    """An evaluation's record fields (:func:`fedhv.metrics.summary.task_metrics`) for one split."""
    from fedhv.metrics.summary import task_metrics

    scores, loss = evaluate_means(model, x, y, batch_size, objective)
    return task_metrics(scores, loss, task_metric_list(objective, len(loss)), eval_reference)
