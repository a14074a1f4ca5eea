"""Data as the ecosystem holds it: a local parquet dataset with a natural id column, split with Flower Datasets.

A Hugging Face ``datasets`` user's data: MNIST digits written to a parquet file with an ``image`` column, two
task columns (``digit``, 10 classes; ``high``, the digit >= 5) and a ``writer`` column -- 24 writers, each
writing mostly a few digits of their own, with unequal sizes (a natural federation, not a Dirichlet draw).
It is read back offline with ``load_dataset("parquet")``, each writer becomes one client through Flower
Datasets' ``NaturalIdPartitioner``, and FedHV (the paper's map and its scale-free variant) and Uniform train
the same CNN on it.

    FEDHV_DATA=../shared/data python examples/hf_parquet_writers.py           # 12k samples, 60 rounds
    FEDHV_DATA=../shared/data python examples/hf_parquet_writers.py --small   # seconds (the test suite)

Needs ``pip install 'fedhv[hf]'`` (datasets 4.x, flwr-datasets 0.6.1). Nothing is downloaded.
"""

import argparse
import gzip
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # a local file: never ask the hub

import numpy as np
import torch
from datasets import ClassLabel, Dataset, Features, Image, Value, load_dataset
from flwr_datasets.partitioner import NaturalIdPartitioner
from torch import nn

import fedhv

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
n_train, n_test, rounds, steps = (1200, 400, 8, 10) if args.small else (12000, 5000, 60, 10)


def idx(name: str) -> np.ndarray:
    """An MNIST IDX file (gzipped) as a uint8 array."""
    raw = gzip.decompress((Path(os.environ.get("FEDHV_DATA", "../shared/data")) / "mnist" / f"{name}.gz").read_bytes())
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw[4 + 4 * dims :], dtype=np.uint8).reshape(shape)


def table(images: str, labels: str, n: int, writers: bool) -> Dataset:
    """MNIST rows as a datasets.Dataset: image, digit, high and (training rows) the writer."""
    x, digit = idx(images)[:n], idx(labels)[:n].astype(np.int64)
    rows = {"image": list(x), "digit": digit, "high": (digit >= 5).astype(np.int64)}
    features = {"image": Image(), "digit": ClassLabel(num_classes=10), "high": ClassLabel(names=["low", "high"])}
    if writers:  # writer w writes mostly the digits w % 10 and (w + 3) % 10, and one in five at random
        rng = np.random.default_rng(1)
        own = rng.random(n) < 0.8
        wanted = [np.flatnonzero(np.isin(np.arange(24) % 10, [d, (d - 3) % 10])) for d in range(10)]
        rows["writer"] = np.where(own, [f"writer-{rng.choice(wanted[d]):02d}" for d in digit],
                                  [f"writer-{w:02d}" for w in rng.integers(0, 24, n)])
        features["writer"] = Value("string")
    return Dataset.from_dict(rows, features=Features(features))


folder = Path(tempfile.mkdtemp(prefix="fedhv-hf-"))
table("train-images-idx3-ubyte", "train-labels-idx1-ubyte", n_train, True).to_parquet(folder / "train.parquet")
table("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", n_test, False).to_parquet(folder / "test.parquet")

# --- a user's part: their parquet files, Flower Datasets' partitioner, fedhv ---------------------------------
files = load_dataset("parquet", data_files={"train": str(folder / "train.parquet"),
                                            "test": str(folder / "test.parquet")})
data = fedhv.FederatedDataset.from_hf(files["train"], ["digit", "high"], features="image", test=files["test"],
                                      partitioner=NaturalIdPartitioner(partition_by="writer"), progress=False)
print(f"clients {data.num_clients} ({data.client_ids[0]} ... {data.client_ids[-1]}): sizes "
      f"{min(data.client_sizes)} .. {max(data.client_sizes)}; x {tuple(data.x.shape)}; tasks "
      f"{[(t.name, t.size) for t in data.tasks]}")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Flatten(), nn.Linear(32 * 49, 64), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(64, 10), nn.Linear(64, 2)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


# the digit's cross-entropy moves on a larger scale than the binary task's: FedHV warns before round 1 and names
# its scale-free variant, run here beside the paper's map
cal = 3 if args.small else 10
methods = {"fedhv": fedhv.FedHV(lr_global=1.0, calibration_rounds=cal),
           "fedhv-scale-free": fedhv.FedHV(lr_global=1.0, calibration_rounds=cal, slack_scale="calibrated-range"),
           "uniform": fedhv.Uniform(lr_global=1.0)}
for label, method in methods.items():
    torch.manual_seed(args.seed)
    hist = fedhv.simulate(Net(), data, method, rounds=rounds, clients_per_round=12, local_steps=steps, batch_size=16,
                          lr_local=0.1, seed=args.seed, eval_every=rounds, progress=False)
    last = hist.evaluations[-1]
    print(f"{label}: MeanAcc {last['mean_acc']:.2f} WorstAcc {last['worst_acc']:.2f} task accuracy "
          f"{[round(v, 2) for v in last['task_score']]} last weights {[round(w, 3) for w in hist.rounds[-1]['weights']]}")
