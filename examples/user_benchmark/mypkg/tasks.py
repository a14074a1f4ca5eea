"""Two tasks on synthetic data: the sign of x0 (2 classes) and the quadrant of (x1, x2) (4 classes).

Named in a configuration as ``data.benchmark = "mypkg.tasks:make_benchmark"``.
"""

import torch
from torch import nn

import fedhv


class MLP(nn.Module):
    """A shared encoder and one linear head per task."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Dropout(0.1))
        self.heads = nn.ModuleList([nn.Linear(width, 2), nn.Linear(width, 4)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def _split(n: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed))
    return x, [(x[:, 0] > 0).long(), (x[:, 1] > 0).long() * 2 + (x[:, 2] > 0).long()]


def make_benchmark() -> fedhv.UserBenchmark:
    return fedhv.UserBenchmark(
        tasks=[fedhv.Task("sign", size=2), fedhv.Task("quadrant", size=4)],
        train=_split(2000, 0), test=_split(500, 1), model=MLP, version="1",
    )
