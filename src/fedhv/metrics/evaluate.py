"""Batched evaluation of a multi-task model (eval mode: no dropout, no augmentation)."""

from __future__ import annotations

import torch
from torch import nn

from fedhv.sim.local import per_sample_nll


@torch.no_grad()
def per_sample_losses(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample task losses and correctness.

    Returns
    -------
    losses : Tensor ``[n, m]``
        Negative log-likelihood of the true label.
    correct : Tensor, bool ``[n, m]``
        Whether the arg-max prediction equals the label.
    """
    losses, correct = [], []
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logps = model(xb)
        losses.append(per_sample_nll(logps, yb))
        correct.append(torch.stack([lp.argmax(-1) == yb[:, i] for i, lp in enumerate(logps)], -1))
    return torch.cat(losses), torch.cat(correct)


def evaluate_tasks(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096
) -> tuple[list[float], list[float]]:
    """Per-task accuracy (%) and mean loss over a whole evaluation set."""
    was_training = model.training
    model.eval()
    losses, correct = per_sample_losses(model, x, y, batch_size)
    model.train(was_training)
    acc = (correct.double().mean(0) * 100.0).tolist()
    loss = losses.double().mean(0).tolist()
    return acc, loss
