"""Batched evaluation of a multi-task model (eval mode: no dropout, no augmentation)."""

from __future__ import annotations

import torch
from torch import nn

from fedhv.objectives import CLASSIFICATION, Objective


@torch.no_grad()
def per_sample_losses(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096,
    objective: Objective = CLASSIFICATION,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample task losses and correctness (model in its current mode).

    Returns
    -------
    losses : Tensor ``[n, m]``
    correct : Tensor ``[n, m]``
        1/0 for classification, the fraction of correct attributes for multi-label tasks.
    """
    losses, correct = [], []
    for start in range(0, len(x), batch_size):
        loss, corr = objective.per_sample(model(x[start : start + batch_size]), y[start : start + batch_size])
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
