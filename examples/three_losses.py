"""Three tasks with three loss types, each with its own loss and score (only public fedhv names).

    python examples/three_losses.py            # 20 clients, 30 rounds
    python examples/three_losses.py --small    # seconds (what the test suite runs)
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import fedhv

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
small = parser.parse_args().small
n, clients, rounds = (1500, 6, 8) if small else (12000, 20, 30)

torch.manual_seed(0)
x = torch.randn(n, 12)
label = x[:, :3].argmax(1)                                  # classification: 3 classes
attrs = (x[:, 3:7] > 0).float()                             # multi-label: 4 attributes
target = torch.stack([x[:, 7] + x[:, 8], 0.5 * x[:, 9]], 1)  # regression: 2 targets
cut = n * 4 // 5



# Per-sample loss and score of each task, in PyTorch's convention: f(output [N, size], target) -> [N];
# target: int64 [N] class labels (classification), float [N, size] (multilabel, regression).
def smoothed_ce(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(o, y, label_smoothing=0.1, reduction="none")


tasks = [
    fedhv.Task("digit", "classification", 3, loss=smoothed_ce, score=lambda o, y: (o.argmax(1) == y).float()),
    fedhv.Task("attrs", "multilabel", 4, loss=nn.BCEWithLogitsLoss(),  # a module loss: used with reduction="none"
               score=lambda o, y: ((o > 0).float() == y).float().mean(1)),
    fedhv.Task("coords", "regression", 2, loss=nn.SmoothL1Loss(), score=lambda o, y: (o - y).abs().mean(1),
               metric="mae", higher_is_better=False),
]


class ThreeHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(64, 3), nn.Linear(64, 4), nn.Linear(64, 2)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


def check(model: nn.Module) -> list[float]:
    """Plain-torch test metrics: class accuracy %, attribute accuracy %, MSE."""
    with torch.no_grad():
        o1, o2, o3 = model.eval()(x[cut:])
    return [100 * float((o1.argmax(1) == label[cut:]).float().mean()),
            100 * float(((o2 > 0).float() == attrs[cut:]).float().mean()), float(F.mse_loss(o3, target[cut:]))]


data = fedhv.FederatedDataset.from_tensors(
    x[:cut], [label[:cut], attrs[:cut], target[:cut]], tasks, clients=clients, samples_per_client=cut // clients // 2,
    alpha=1.0, test=(x[cut:], [label[cut:], attrs[cut:], target[cut:]]))
model = ThreeHeads()
before = check(model)
history = fedhv.simulate(model, data, fedhv.FedHV(lr_global=1.0, calibration_rounds=3 if small else 10),
                         rounds=rounds, clients_per_round=clients // 2, local_steps=10, batch_size=32, lr_local=0.3)
last = history.evaluations[-1]
print(f"fedhv round {last['round']}: scores {[round(a, 4) for a in last['task_score']]} "
      f"({', '.join(m['metric'] for m in history.task_metrics)}), "
      f"loss {[round(v, 4) for v in last['task_loss']]}")
print(f"weights {[round(w, 4) for w in history.rounds[-1]['weights']]}")
print(f"check before: {[round(v, 4) for v in before]}")
print(f"check after: {[round(v, 4) for v in check(history.model)]}")
