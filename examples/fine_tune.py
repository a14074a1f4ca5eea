"""Federated fine-tuning of two task heads on a frozen pretrained encoder (FedHV and Uniform).

    python examples/fine_tune.py              # 20 clients, 30 rounds
    python examples/fine_tune.py --small      # seconds (what the test suite runs)

The encoder is pretrained centrally (plain PyTorch) and frozen with requires_grad_(False): fedhv
neither trains nor sends it. The scores fedhv reports are checked against a plain-PyTorch
evaluation of History.model.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import fedhv

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
small = parser.parse_args().small
n, clients, rounds = (800, 6, 4) if small else (8000, 20, 30)

torch.manual_seed(0)
x = torch.randn(n, 12)
label = (x[:, :4].sum(1) > 0).long() + (x[:, 4:8].sum(1) > 0).long()  # task 1: 3 classes
target = torch.tanh(x[:, 8:]).sum(1, keepdim=True)                     # task 2: a regression target
cut = n * 3 // 4

# "pretrained" encoder: fitted centrally on a proxy task (all features), then frozen
encoder = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh())
proxy = nn.Linear(32, 12)
opt = torch.optim.Adam([*encoder.parameters(), *proxy.parameters()], lr=0.01)
for _ in range(100 if small else 500):
    opt.zero_grad()
    F.mse_loss(proxy(encoder(x[:cut])), torch.tanh(x[:cut])).backward()
    opt.step()
encoder.requires_grad_(False)


class FineTune(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = encoder
        self.heads = nn.ModuleList([nn.Linear(32, 3), nn.Linear(32, 1)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


data = fedhv.FederatedDataset.from_tensors(
    x[:cut], [label[:cut], target[:cut]],
    tasks=[fedhv.Task("sum", "classification", size=3), fedhv.Task("tanh", "regression", size=1)],
    partition="dirichlet-disjoint", clients=clients, samples_per_client=cut // clients, alpha=0.5,
    test=(x[cut:], [label[cut:], target[cut:]]),
)
for method in (fedhv.FedHV(calibration_rounds=3 if small else 10), fedhv.Uniform()):
    torch.manual_seed(1)
    history = fedhv.simulate(FineTune(), data, method, rounds=rounds, clients_per_round=clients // 2, local_steps=10,
                             batch_size=16, lr_local=0.3, progress=False)
    model, last = history.model, history.evaluations[-1]
    with torch.no_grad():  # plain PyTorch evaluation of the returned model
        out_cls, out_reg = model(x[cut:])
        acc = 100 * (out_cls.argmax(1) == label[cut:]).double().mean().item()
        mse = F.mse_loss(out_reg.double(), target[cut:].double()).item()
    same = all(torch.equal(a, b) for a, b in zip(model.encoder.parameters(), encoder.parameters()))
    print(f"{type(method).__name__}: fedhv [{last['task_acc'][0]:.6f}, {last['task_score'][1]:.6f}] "
          f"plain [{acc:.6f}, {mse:.6f}] encoder unchanged {same}")
