"""FedHV on tasks whose losses live on different scales (issue 27, item 9).

MNIST with three tasks of one input: the digit (10 classes, loss starts near log 10 = 2.3),
its parity and whether it is >= 5 (2 classes each, loss near log 2 = 0.69). FedHV's paper
map weighs raw slacks ``r_i - F_i``: the 10-class loss falls furthest below its calibrated
maximum, so its slack is the largest and its weight the smallest. The scale-free variant
(``slack_scale = "calibrated-range"``) measures each slack in units of the task's calibrated
range ``r_i - min_t F_i^t``. Runs FedHV, the variant and Uniform (``--methods all``: every registered
method too, each with ``eta_g = 1``, as a new user would) for several seeds and prints the worst-task and
per-task accuracy (mean +- std) as a markdown table.

    FEDHV_DATA=../shared/data python perf/loss_scales.py --seeds 0,1,2 --rounds 100
    FEDHV_DATA=../shared/data python perf/loss_scales.py --seeds 0,1 --rounds 30 --methods all
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch import nn

import fedhv
from fedhv import safe_io
from fedhv.data.idx import load_mnist


class CNN(nn.Module):
    """A LeNet-sized CNN with one linear head per task."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5),
                                     nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(320, 50), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(50, 10), nn.Linear(50, 2), nn.Linear(50, 2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def dataset(n_train: int, n_test: int, clients: int, alpha: float) -> fedhv.FederatedDataset:
    splits = load_mnist(download=False)

    def tensors(split: str, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        images, labels = splits[split]
        x = torch.from_numpy(images[:n]).float().div(255).sub(0.1307).div(0.3081).unsqueeze(1)
        digit = torch.from_numpy(labels[:n]).long()
        return x, [digit, digit % 2, (digit >= 5).long()]

    x, y = tensors("train", n_train)
    xt, yt = tensors("test", n_test)
    tasks = [fedhv.Task("digit", size=10), fedhv.Task("parity"), fedhv.Task("ge5")]
    return fedhv.FederatedDataset.from_tensors(x, y, tasks, partition="dirichlet-disjoint", clients=clients,
                                               alpha=alpha, test=(xt, yt))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--train", type=int, default=12000)
    p.add_argument("--test", type=int, default=5000)
    p.add_argument("--json", default=None, help="write every run's final evaluation here")
    p.add_argument("--methods", default="", help="all, or comma-separated registered methods to run besides "
                   "FedHV, its variant and Uniform")
    args = p.parse_args()
    data = dataset(args.train, args.test, clients=30, alpha=0.5)
    methods = {"FedHV (paper map)": lambda: fedhv.FedHV(lr_global=1.0),
               "FedHV, slack_scale = calibrated-range": lambda: fedhv.FedHV(lr_global=1.0,
                                                                            slack_scale="calibrated-range"),
               "Uniform": lambda: fedhv.Uniform(lr_global=1.0)}
    from fedhv.registry import METHODS

    extra = [m for m in METHODS.names() if m not in ("fedhv", "uniform", "linear")] if args.methods == "all" \
        else [m for m in args.methods.split(",") if m]
    for name in extra:
        methods[name] = lambda name=name: METHODS[name](lr_global=1.0)  # type: ignore[misc]
    results: dict[str, list[dict]] = {}
    for name, make in methods.items():
        for seed in [int(s) for s in args.seeds.split(",")]:
            torch.manual_seed(seed)
            start = time.perf_counter()
            hist = fedhv.simulate(CNN(), data, make(), rounds=args.rounds, clients_per_round=10, local_steps=10,
                                  batch_size=32, lr_local=0.05, seed=seed, eval_every=args.rounds, progress=False)
            last = hist.evaluations[-1]
            weights = hist.rounds[-1].get("weights")
            results.setdefault(name, []).append({"seed": seed, **last, "weights": weights})
            print(f"{name} seed {seed}: acc {[round(a, 2) for a in last['task_acc']]} worst {last['worst_acc']:.2f} "
                  f"weights {weights and [round(w, 3) for w in weights]} ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)
    if args.json:
        safe_io.write_json(args.json, results)

    def ms(values: list[float]) -> str:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {sd:.2f}"

    print("| method | WorstAcc | digit | parity | ≥ 5 | final weights (digit, parity, ≥ 5) |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        accs = list(zip(*[r["task_acc"] for r in runs]))
        ws = [r["weights"] for r in runs if r["weights"]]
        wmean = [round(statistics.mean(w[i] for w in ws), 3) for i in range(3)] if ws else "-"
        print(f"| {name} | {ms([r['worst_acc'] for r in runs])} | {' | '.join(ms(list(a)) for a in accs)} | {wmean} |")


if __name__ == "__main__":
    main()
