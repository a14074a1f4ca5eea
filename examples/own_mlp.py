"""FedHV on your own two-task MLP and synthetic data, end to end (no fedhv internals).

    python examples/own_mlp.py              # 30 clients, 40 rounds
    python examples/own_mlp.py --small      # seconds (what the test suite runs)
"""

import argparse

import torch
from torch import nn

import fedhv

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
small = parser.parse_args().small
n, clients, rounds = (600, 6, 3) if small else (6000, 30, 40)

torch.manual_seed(0)  # data and theta^0; fedhv keys all other randomness by `seed`
x = torch.randn(n, 10)
label = (x[:, :5].sum(1) > 0).long()          # task 1: a binary class
target = x[:, 5:].mean(1, keepdim=True)       # task 2: a regression target
cut = n * 4 // 5


class TwoTaskMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Dropout(0.2))
        self.heads = nn.ModuleList([nn.Linear(64, 2), nn.Linear(64, 1)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


data = fedhv.FederatedDataset.from_tensors(
    x[:cut], [label[:cut], target[:cut]],
    tasks=[fedhv.Task("sign", "classification", size=2), fedhv.Task("mean", "regression", size=1)],
    partition="dirichlet", clients=clients, samples_per_client=cut // clients, alpha=0.3,
    test=(x[cut:], [label[cut:], target[cut:]]),
)
history = fedhv.simulate(
    TwoTaskMLP(), data, fedhv.FedHV(lr_global=1.0, calibration_rounds=5 if small else 20),
    rounds=rounds, clients_per_round=clients // 2, local_steps=5, batch_size=16, lr_local=0.1, eval_every=5,
)
last = history.evaluations[-1]
print(f"engine {history.engine}, reference {[round(r, 3) for r in history.reference]}")
print(f"round {last['round']}: accuracy(sign) {last['task_acc'][0]:.1f} %, loss {[round(v, 3) for v in last['task_loss']]}")
print(f"weights of the last round {[round(w, 3) for w in history.rounds[-1]['weights']]}")
