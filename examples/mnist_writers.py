"""Your own problem: a BatchNorm CNN, three task kinds, a natural partition with tiny and empty clients.

MNIST digits with three tasks of different kinds -- the digit (10-class classification), three
attributes (multilabel: even, >= 5, has a closed loop: 0 6 8 9) and the ink mass (regression:
the standardised mean pixel value) -- on 40 "writers" whose sizes follow a power law, so some
hold fewer samples than a batch, plus one empty client. Runs FedHV, its scale-free variant and
Uniform and checks
fedhv's evaluation of History.model against a plain-PyTorch one.

    FEDHV_DATA=../shared/data python examples/mnist_writers.py           # 12k samples, 60 rounds
    FEDHV_DATA=../shared/data python examples/mnist_writers.py --small   # seconds (the test suite)
"""

import argparse
import gzip
import os
from pathlib import Path

import torch
from torch import nn

import fedhv

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
n_train, n_test, rounds, steps = (1500, 500, 4, 3) if args.small else (12000, 5000, 60, 10)


def idx(name: str) -> torch.Tensor:
    """An MNIST IDX file (gzipped) as a uint8 tensor."""
    raw = gzip.decompress((Path(os.environ.get("FEDHV_DATA", "../shared/data")) / "mnist" / f"{name}.gz").read_bytes())
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(raw[4 + 4 * dims :]), dtype=torch.uint8).reshape(shape)


def split(images: str, labels: str, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = idx(images)[:n].float().div(255).unsqueeze(1)  # uint8 is refused: convert the scale yourself
    digit = idx(labels)[:n].long()
    attrs = torch.stack([digit % 2 == 0, digit >= 5, torch.isin(digit, torch.tensor([0, 6, 8, 9]))], 1).float()
    ink = x.mean((1, 2, 3), keepdim=False).unsqueeze(1)
    return x, [digit, attrs, (ink - 0.13) / 0.04]


x, y = split("train-images-idx3-ubyte", "train-labels-idx1-ubyte", n_train)
x_test, y_test = split("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", n_test)
tasks = [fedhv.Task("digit", size=10), fedhv.Task("attrs", "multilabel", 3), fedhv.Task("ink", "regression", 1)]

# 40 writers with power-law sizes (the smallest below the batch of 16) and one empty client
g = torch.Generator().manual_seed(1)
sizes = (torch.arange(1, 41).float() ** -1.6 * n_train / sum(k ** -1.6 for k in range(1, 41))).long().clamp(min=3)
order = torch.randperm(n_train, generator=g).tolist()
bounds = torch.cumsum(sizes, 0).clamp(max=n_train).tolist()
clients = [order[a:b] for a, b in zip([0, *bounds[:-1]], bounds)] + [[]]
data = fedhv.FederatedDataset.from_tensors(x, y, tasks, partition=clients, test=(x_test, y_test))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(4),
                                     nn.Flatten(), nn.Linear(32 * 9, 64), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(64, 10), nn.Linear(64, 3), nn.Linear(64, 1)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


@torch.no_grad()
def plain_torch(model: nn.Module) -> list[float]:
    """Test metrics by hand: digit accuracy %, attribute accuracy %, ink MSE."""
    o1, o2, o3 = model.eval()(x_test)
    return [100 * float((o1.argmax(1) == y_test[0]).float().mean()),
            100 * float(((o2 > 0).float() == y_test[1]).float().mean()), float((o3 - y_test[2]).square().mean())]


print(f"clients {data.num_clients}: sizes {sorted(data.client_sizes)[:6]} ... {max(data.client_sizes)}")
cal = 3 if args.small else 10
methods = {"fedhv": fedhv.FedHV(lr_global=1.0, calibration_rounds=cal),
           "fedhv-scale-free": fedhv.FedHV(lr_global=1.0, calibration_rounds=cal, slack_scale="calibrated-range"),
           "uniform": fedhv.Uniform(lr_global=1.0)}
for label, method in methods.items():
    torch.manual_seed(args.seed)
    hist = fedhv.simulate(Net(), data, method, rounds=rounds, clients_per_round=10, local_steps=steps, batch_size=16,
                          lr_local=0.02, momentum=0.9, seed=args.seed, eval_every=rounds, progress=False)
    last = hist.evaluations[-1]
    print(f"{label}: scores {[round(v, 4) for v in last['task_score']]} "
          f"({', '.join(m['metric'] for m in hist.task_metrics)}) MeanAcc {last['mean_acc']:.2f} "
          f"WorstAcc {last['worst_acc']:.2f} engine {hist.engine}")
    print(f"{label} plain torch: {[round(v, 4) for v in plain_torch(hist.model)]}")
