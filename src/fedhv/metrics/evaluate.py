"""Batched evaluation of a multi-task model (eval mode: no dropout, no augmentation)."""

from __future__ import annotations

import torch
from torch import nn

from fedhv.models.inference import inference_forward
from fedhv.objectives import CLASSIFICATION, Objective


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


def evaluate_tasks(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096,
    objective: Objective = CLASSIFICATION,
) -> tuple[list[float], list[float]]:
    """Per-task accuracy (%) and mean loss over a whole evaluation set.

    Runs on the device of ``model`` and ``x``; the returned Python floats are copied
    from the device, so the call returns only after the device finished (a clock read
    right after it includes all of the evaluation's GPU work).
    """
    was_training = model.training
    model.eval()
    losses, correct = per_sample_losses(model, x, y, batch_size, objective)
    model.train(was_training)
    acc = (correct.double().mean(0) * 100.0).tolist()
    loss = losses.double().mean(0).tolist()
    return acc, loss
