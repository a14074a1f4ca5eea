"""A user benchmark whose 2-class task holds label 7 (issue 28, item 8): ``bad_label_benchmark:make_benchmark``."""

from __future__ import annotations

import torch
from torch import nn

import fedhv


def make_benchmark() -> fedhv.UserBenchmark:
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    y[17] = 7
    return fedhv.UserBenchmark(tasks=[fedhv.Task("a", size=2)], train=(x[:200], [y[:200]]), test=(x[200:], [y[200:]]),
                               model=lambda: nn.Linear(4, 2), version="1")
