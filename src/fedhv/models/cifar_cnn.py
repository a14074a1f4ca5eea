"""CNN for CIFAR10-MNIST (paper B.3; reference notes §2.2).

Encoder (3x32x32): conv 3->64 (3x3, pad 1) -> ReLU -> max-pool 2 -> conv 64->64
(3x3, pad 1) -> ReLU -> max-pool 2 -> flatten 4096 -> linear 4096->384 -> ReLU ->
dropout 0.5 -> linear 384->192 -> ReLU -> dropout 0.5 (1,685,888 parameters).
Head per task: linear 192->100 -> linear 100->10 with no non-linearity in between (as
in the reference code), then log-softmax (20,310 parameters).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.models.base import MultiTaskModel
from fedhv.models.lenet import max_pool2


def _drop(h: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    return h if mask is None else h * mask.to(h.dtype) * (1.0 / (1.0 - p))


class CifarHead(nn.Module):
    """Factorised linear head 192 -> 100 -> C."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(192, 100)
        self.fc2 = nn.Linear(100, classes)


class CifarCNN(MultiTaskModel):
    """Shared two-convolution encoder with one factorised linear head per task."""

    def __init__(self, num_classes: tuple[int, ...] = (10, 10), dropout: float = 0.5) -> None:
        super().__init__()
        self.dropout = dropout
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(4096, 384)
        self.fc2 = nn.Linear(384, 192)
        self.heads = nn.ModuleList(CifarHead(c) for c in num_classes)

    def dropout_sites(self) -> dict[str, int]:
        return {"fc1": 384, "fc2": 192}

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        h = max_pool2(F.relu(self.conv1(x)))
        h = max_pool2(F.relu(self.conv2(h)))
        h = _drop(F.relu(self.fc1(h.flatten(1))), None if masks is None else masks["fc1"], self.dropout)
        z = _drop(F.relu(self.fc2(h)), None if masks is None else masks["fc2"], self.dropout)
        out = []
        for head in self.heads:
            assert isinstance(head, CifarHead)
            out.append(F.log_softmax(head.fc2(head.fc1(z)), dim=-1))
        return out
