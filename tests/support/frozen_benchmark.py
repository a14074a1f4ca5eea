"""A user benchmark whose model has a frozen encoder layer and a frozen head bias (``requires_grad=False``),
importable as ``frozen_benchmark:make_benchmark`` (``tests/`` is on ``PYTHONPATH``): a Flower node serving
a fine-tuning run (``tests/unit/sim/test_frozen_parameters.py``)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import bn_benchmark
import fedhv


class FrozenNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(12, 3), nn.Linear(12, 2)])
        self.encoder[1].requires_grad_(False)  # the "pretrained" first layer
        self.heads[1].bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def make_benchmark() -> fedhv.UserBenchmark:
    """``bn_benchmark``'s data and tasks with :class:`FrozenNet` as the model."""
    return dataclasses.replace(bn_benchmark.make_benchmark(), model=FrozenNet)
