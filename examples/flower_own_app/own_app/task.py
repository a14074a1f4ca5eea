"""The app's model, tasks, data and local training (plain PyTorch; nothing here is fedhv's).

Two tasks of different kinds on 8 features: ``a`` classifies the sign of ``x₀ + x₁`` (2 classes,
cross-entropy, accuracy) and ``b`` regresses ``x₂ − x₃`` (mean squared error). The encoder has a
BatchNorm layer, so the model carries buffers (running statistics) that are federated with the
weights. Client ``k`` of ``n`` draws its features from a Gaussian shifted by ``k`` (non-IID),
seeded by ``k``; client 0 holds only 5 samples (fewer than a batch): batches are drawn with
replacement. The test set is drawn from all clients' distributions with its own seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

TASKS = ("a", "b")
BATCH = 32


class Net(nn.Module):
    """A shared encoder (with BatchNorm) and one head per task."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.heads = nn.ModuleDict({"a": nn.Linear(32, 2), "b": nn.Linear(32, 1)})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.encoder(x)
        return {name: head(h) for name, head in self.heads.items()}


def targets(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"a": (x[:, 0] + x[:, 1] > 0).long(), "b": (x[:, 2] - x[:, 3]).unsqueeze(1)}


def client_data(k: int, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + k)
    shift = torch.zeros(8)
    shift[k % 4] = 1.5 * (k / max(n - 1, 1) - 0.5)
    x = torch.randn(5 if k == 0 else 96, 8, generator=g) + shift
    return x, targets(x)


def test_data(n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    x = torch.cat([client_data(k, n)[0][:5] for k in range(n)] + [torch.randn(300, 8, generator=g)])
    return x, targets(x)


def task_losses(model: nn.Module, x: torch.Tensor, y: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    out = model(x)
    return [nn.functional.cross_entropy(out["a"], y["a"]), nn.functional.mse_loss(out["b"], y["b"])]


def metrics(model: nn.Module, x: torch.Tensor, y: dict[str, torch.Tensor]) -> dict[str, float]:
    """Test metrics: accuracy (%) of ``a``, mean squared error of ``b`` (evaluation mode)."""
    model.eval()
    with torch.no_grad():
        out = model(x)
    return {"acc_a": 100.0 * float((out["a"].argmax(1) == y["a"]).float().mean()),
            "mse_b": float(nn.functional.mse_loss(out["b"], y["b"]))}


def local_update(model: nn.Module, k: int, n: int, weights: Sequence[float], server_round: int, lr: float,
                 steps: int) -> tuple[list[float], int]:
    """The report (the task losses at the received model, evaluation mode) and ``steps`` SGD steps
    on ``Σ wᵢ ℓᵢ`` (training mode: BatchNorm statistics move). Returns ``(report, samples)``."""
    x, y = client_data(k, n)
    model.eval()
    with torch.no_grad():
        report = [float(loss) for loss in task_losses(model, x, y)]
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(server_round * 1000 + k)
    for _ in range(steps):
        batch = torch.randint(len(x), (BATCH,), generator=g)  # with replacement: a tiny client too
        losses = task_losses(model, x[batch], {name: t[batch] for name, t in y.items()})
        opt.zero_grad()
        sum(w * loss for w, loss in zip(weights, losses)).backward()
        opt.step()
    return report, len(x)
