"""The paper's MultiMNIST model (B.3, fedhv's ``LeNetMTL`` in plain PyTorch): a LeNet encoder, one head per digit.

Encoder: conv 1->10 (3x3, pad 1), max-pool 2, ReLU, conv 10->15 (3x3), max-pool 2, ReLU, flatten 540,
linear 540->50, ReLU, dropout 0.5. Head: linear 50->50, ReLU, dropout 0.5, linear 50->10.
"""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """The shared LeNet encoder and two 10-class heads."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 10, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 15, 3),
                                     nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(540, 50), nn.ReLU(),
                                     nn.Dropout(0.5))
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(50, 50), nn.ReLU(), nn.Dropout(0.5), nn.Linear(50, 10))
                                    for _ in range(2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def task_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The two digits' cross-entropies."""
    return [nn.functional.cross_entropy(out, y[:, i]) for i, out in enumerate(model(x))]


@torch.no_grad()
def test_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Per-task accuracy (%) and loss, MeanAcc and WorstAcc (evaluation mode)."""
    model.eval()
    outs = model(x)
    acc = [100.0 * float((o.argmax(1) == y[:, i]).float().mean()) for i, o in enumerate(outs)]
    loss = [float(nn.functional.cross_entropy(o, y[:, i])) for i, o in enumerate(outs)]
    return {"acc_left": acc[0], "acc_right": acc[1], "loss_left": loss[0], "loss_right": loss[1],
            "mean_acc": sum(acc) / 2, "worst_acc": min(acc)}
