"""The app's model, tasks and data (plain PyTorch).

Two tasks on 8 features: task ``a`` predicts the sign of ``x₀ + x₁`` (2 classes), task ``b``
the band of ``x₂ − x₃`` (3 classes). Client ``k`` of ``n`` draws its features from a Gaussian
whose mean is shifted by ``k`` (non-IID), seeded by ``k``; the test set is drawn from all clients'
distributions with its own seed.
"""

from __future__ import annotations

import torch
from torch import nn

TASKS = {"a": 2, "b": 3}


class Net(nn.Module):
    """A shared encoder and one head per task."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.heads = nn.ModuleDict({name: nn.Linear(32, size) for name, size in TASKS.items()})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.encoder(x)
        return {name: head(h) for name, head in self.heads.items()}


def labels(x: torch.Tensor) -> dict[str, torch.Tensor]:
    s = x[:, 2] - x[:, 3]
    return {"a": (x[:, 0] + x[:, 1] > 0).long(), "b": (s > -0.5).long() + (s > 0.5).long()}


def client_data(k: int, n: int, samples: int = 96) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + k)
    shift = torch.zeros(8)
    shift[k % 4] = 1.5 * (k / max(n - 1, 1) - 0.5)
    x = torch.randn(samples, 8, generator=g) + shift
    return x, labels(x)


def test_data(n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    xs = [client_data(k, n, 64)[0] + 0.1 * torch.randn(64, 8, generator=torch.Generator().manual_seed(7 + k))
          for k in range(n)]
    x = torch.cat(xs)
    return x, labels(x)


def task_losses(model: nn.Module, x: torch.Tensor, y: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    out = model(x)
    return [nn.functional.cross_entropy(out[name], y[name]) for name in TASKS]


def accuracies(model: nn.Module, x: torch.Tensor, y: dict[str, torch.Tensor]) -> dict[str, float]:
    with torch.no_grad():
        out = model(x)
    return {name: 100.0 * float((out[name].argmax(1) == y[name]).float().mean()) for name in TASKS}
