"""A user's plain ``nn.Module`` on the batched (torch.func vmap) vs the sequential engine.

Usage::

    python perf/module_engine.py [--rounds R] [--clients-per-round M] [--hidden H]

A two-task MLP with ``nn.Dropout`` (a standard module, not one of fedhv's fused models)
trained with Uniform weights through the public API (``fedhv.simulate``) on synthetic
data, once per engine in one process: median seconds per round (of the rounds after the
first) and the batched / sequential ratio, plus the largest parameter difference of the
two final models (float32: round-off only, the engines draw the same batches and masks).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

import fedhv


class TwoTaskMLP(nn.Module):
    """Shared encoder (Linear-ReLU-Dropout, twice) and one linear head per task."""

    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Dropout(0.2),
                                     nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.2))
        self.heads = nn.ModuleList([nn.Linear(hidden, 10), nn.Linear(hidden, 10)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args()
    torch.manual_seed(0)
    n, d, clients = 12000, 64, 30
    x = torch.randn(n, d)
    y1 = (x[:, :32] @ torch.randn(32, 10)).argmax(1)
    y2 = (x[:, 32:] @ torch.randn(32, 10)).argmax(1)
    tasks = [fedhv.Task("a", "classification", size=10), fedhv.Task("b", "classification", size=10)]
    data = fedhv.FederatedDataset.from_tensors(x, [y1, y2], tasks=tasks, partition="dirichlet", clients=clients,
                                               samples_per_client=n // clients, alpha=0.3)
    model = TwoTaskMLP(d, args.hidden)
    results = {}
    for engine in ("sequential", "batched"):
        hist = fedhv.simulate(model, data, fedhv.Uniform(lr_global=1.0), rounds=args.rounds + 1, seed=0,
                              clients_per_round=args.clients_per_round, local_steps=10, batch_size=32,
                              lr_local=0.05, engine=engine, eval_every=1000)
        times = [r["time_client_s"] + r["time_server_s"] for r in hist.rounds[1:]]  # round 1 warms up
        results[engine] = (statistics.median(times), hist)
        print(f"{engine:10s} engine ({hist.engine}): {results[engine][0]:.3f} s per round "
              f"(median of {args.rounds})")
    seq, bat = results["sequential"], results["batched"]
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(seq[1].model.parameters(), bat[1].model.parameters()))
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), bat[1].model.parameters()))
    print(f"batched / sequential: {bat[0] / seq[0]:.2f} (speed-up {seq[0] / bat[0]:.2f}x); "
          f"largest parameter difference after the last round {diff:.2e} (training moved them by up to {moved:.2e})")


if __name__ == "__main__":
    main()
