"""HV weighting in a plain centralized multi-task loop (no federation), two ways:
the ``HVWeighting`` module and the LibMTL-style ``HVBackward`` adapter.

    python examples/hv_centralized.py           # 600 steps
    python examples/hv_centralized.py --small   # seconds (what the test suite runs)
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from fedhv.weighting import HVBackward, HVWeighting, reference_from_losses

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true")
steps = 80 if parser.parse_args().small else 600

g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 8, generator=g)
label = (x[:, :2].sum(1) > 0).long()       # task 1: binary class
target = x[:, 2:4].mean(1)                 # task 2: regression
train, test = slice(0, 3584), slice(3584, None)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(32, 2), nn.Linear(32, 1)])

    def forward(self, inputs: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(inputs)
        return [head(h) for head in self.heads]


def task_losses(model: nn.Module, rows: slice | torch.Tensor) -> torch.Tensor:
    """The loss vector [m] on the given rows: cross-entropy, MSE."""
    logits, pred = model(x[rows])
    return torch.stack([F.cross_entropy(logits, label[rows]), F.mse_loss(pred.squeeze(-1), target[rows])])


def fresh() -> Net:
    torch.manual_seed(1)
    return Net()


# Reference without a calibration run: the initial model's losses + 0.15 (see fedhv.weighting docs).
reference = reference_from_losses(task_losses(fresh(), train), margin=0.15)
results = {}
for how in ("module", "adapter"):
    model = fresh()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hv, adapter = HVWeighting(reference), HVBackward(reference)
    first = task_losses(model, test).tolist()
    sums = []
    for step in range(steps):
        batch = torch.randint(0, 3584, (64,), generator=torch.Generator().manual_seed(step))
        losses = task_losses(model, batch)
        opt.zero_grad()
        if how == "module":
            weights = hv(losses)                       # w = W(l.detach(); r), no gradient through w
            hv.weighted_loss(losses).backward()        # sum_i w_i l_i
        else:
            weights = torch.as_tensor(adapter.backward(losses))  # LibMTL: weighting.backward(losses)
        opt.step()
        sums.append(float(weights.sum()))
    with torch.no_grad():
        last = task_losses(model, test).tolist()
        acc = 100 * float((model(x[test])[0].argmax(1) == label[test]).float().mean())
    results[how] = torch.cat([p.detach().flatten() for p in model.parameters()])
    print(f"{how}: test loss {[round(v, 4) for v in first]} -> {[round(v, 4) for v in last]}, accuracy {acc:.1f} %, "
          f"last weights {[round(w, 4) for w in weights.tolist()]}, max |sum w - 1| {max(abs(s - 1) for s in sums):.1e}")
print(f"reference {[round(r, 4) for r in reference]}")
print(f"max |theta_module - theta_adapter| {float((results['module'] - results['adapter']).abs().max()):.1e}")
