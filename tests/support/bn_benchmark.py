"""A user benchmark with a BatchNorm model, importable as ``bn_benchmark:make_benchmark`` in every
test process (``tests/`` is on ``PYTHONPATH``; Flower nodes included): issue 27's buffers over Flower."""

from __future__ import annotations

import torch
from torch import nn

import fedhv


class BNNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.BatchNorm1d(12), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(12, 3), nn.Linear(12, 2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def make_benchmark() -> fedhv.UserBenchmark:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(700, 1, 4, 4, generator=g) * 2 + 1
    a = (x[:, 0, 0, 0] > 1).long() + (x[:, 0, 1, 1] > 2).long()
    b = (x[:, 0, 2, 2] > 1).long()
    return fedhv.UserBenchmark(tasks=[fedhv.Task("a", size=3), fedhv.Task("b", size=2)],
                               train=(x[:600], [a[:600], b[:600]]), test=(x[600:], [a[600:], b[600:]]),
                               model=BNNet, version="1")
