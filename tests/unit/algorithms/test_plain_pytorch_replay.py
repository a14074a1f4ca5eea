"""Loss-only methods and a Gramian method (UPGrad on FSMGDA's exchange) against plain PyTorch, on a problem
none of the paper's: a BatchNorm model with a
classification and a regression head, 4 clients of 5 samples, float64. The replay is written from scratch:
eval-mode reports averaged over the clients, the weight rule's formula on them, K full-batch SGD steps per
client on the weighted loss, the mean update and the mean BatchNorm statistics. fedhv's run must equal it to
rounding: parameters, buffers, reports and weights."""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedhv

torch.manual_seed(0)
N, PER, D, K, LR, ROUNDS = 4, 5, 6, 3, 0.2, 4
g = torch.Generator().manual_seed(0)
x = torch.randn(N * PER, D, generator=g, dtype=torch.float64)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
v = x[:, 2:3] - x[:, 3:4]
parts = [list(range(c * PER, (c + 1) * PER)) for c in range(N)]
tasks = [fedhv.Task("cls", "classification", size=3), fedhv.Task("reg", "regression", size=1)]
data = fedhv.FederatedDataset.from_tensors(x, [y, v], tasks, partition=parts)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 1)])
    def forward(self, z):
        h = self.encoder(z)
        return [hd(h) for hd in self.heads]

model = Net().double()

def losses(net, idx):
    out = net(x[idx])
    return torch.stack([F.cross_entropy(out[0], y[idx]), (out[1] - v[idx]).square().mean()])

def dwa(reports, T=2.0):
    if len(reports) < 2: return np.full(2, 0.5)
    r = np.array(reports[-1]) / np.array(reports[-2]); e = np.exp(r / T); return e / e.sum()

def inverse(reports):
    f = np.maximum(np.array(reports[-1]), 1e-6); w = 1 / f; return w / w.sum()

def replay(rule):
    glob = copy.deepcopy(model); w = np.full(2, 0.5); reports = []; ws = []
    for t in range(ROUNDS):
        glob.eval()
        with torch.no_grad():
            rep = torch.stack([losses(glob, p) for p in parts]).mean(0).numpy()
        deltas, bufs = [], []
        for p in parts:
            loc = copy.deepcopy(glob); loc.train(); opt = torch.optim.SGD(loc.parameters(), lr=LR)
            for _ in range(K):
                opt.zero_grad(); (torch.as_tensor(w) @ losses(loc, p)).backward(); opt.step()
            deltas.append([a.detach() - b.detach() for a, b in zip(loc.parameters(), glob.parameters())])
            bufs.append([b.detach().clone() for b in loc.buffers()])
        with torch.no_grad():
            for i, q in enumerate(glob.parameters()): q.add_(torch.stack([d[i] for d in deltas]).mean(0))
            for i, b in enumerate(glob.buffers()):
                if b.is_floating_point(): b.copy_(torch.stack([bb[i] for bb in bufs]).mean(0))
                else: b.copy_(bufs[0][i])
        ws.append(w.tolist()); reports.append(rep.tolist()); w = rule(reports)
    return glob, ws, reports


@pytest.mark.parametrize(("method", "rule"), [(fedhv.DWA(), dwa), (fedhv.InverseLoss(), inverse)], ids=["dwa", "inverse"])
def test_a_loss_only_run_equals_a_plain_pytorch_replay(method: Any, rule: Any) -> None:
    hist = fedhv.simulate(copy.deepcopy(model), data, method, rounds=ROUNDS, clients_per_round=N, local_steps=K,
                          batch_size=PER, lr_local=LR, progress=False, engine="batched")
    glob, ws, reports = replay(rule)
    for a, b in zip(hist.model.parameters(), glob.parameters(), strict=True):
        assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=1e-12)
    for a, b in zip(hist.model.buffers(), glob.buffers(), strict=True):
        assert torch.allclose(a.double(), b.double(), rtol=0, atol=1e-12)
    np.testing.assert_allclose([r["report"] for r in hist.rounds], reports, rtol=0, atol=1e-12)
    np.testing.assert_allclose([r["weights"] for r in hist.rounds], ws, rtol=0, atol=1e-12)
    assert len({tuple(w) for w in ws}) > 1  # the rule moved the weights off 1/m within the run


def test_a_gramian_run_on_fsmgdas_exchange_equals_a_plain_pytorch_replay() -> None:
    """fsmgda-upgrad on the same problem: per client and task, K full-batch steps on that task's loss alone;
    the per-task mean updates; UPGrad's weights (torchjd on their encoder Gramian over its trace); the encoder
    steps by sum_i w_i Dbar_i, each head by its own w_i Dbar_i. Parameters and weights compared (train-mode
    BatchNorm uses batch statistics, so the parameters do not depend on how the buffers are federated)."""
    from torchjd.aggregation import UPGradWeighting

    from fedhv.algorithms.aggregators import FSMGDAUPGrad

    eta = 1.5
    hist = fedhv.simulate(copy.deepcopy(model), data, FSMGDAUPGrad(lr_global=eta), rounds=ROUNDS, clients_per_round=N,
                          local_steps=K, batch_size=PER, lr_local=LR, progress=False, engine="batched")
    glob = copy.deepcopy(model)
    names = [n for n, _ in glob.named_parameters()]
    enc = [i for i, n in enumerate(names) if n.startswith("encoder.")]
    ws = []
    for _ in range(ROUNDS):
        mean = []  # per task: the mean over clients of the update of every parameter
        for task in range(2):
            per_client = []
            for p in parts:
                loc = copy.deepcopy(glob)
                loc.train()
                opt = torch.optim.SGD(loc.parameters(), lr=LR)
                for _ in range(K):
                    opt.zero_grad()
                    losses(loc, p)[task].backward()
                    opt.step()
                per_client.append([a.detach() - b.detach() for a, b in zip(loc.parameters(), glob.parameters())])
            mean.append([torch.stack([c[i] for c in per_client]).mean(0) for i in range(len(names))])
        j = torch.stack([torch.cat([mean[t][i].reshape(-1) for i in enc]) for t in range(2)])
        gram = j @ j.T
        w = UPGradWeighting()(gram / torch.trace(gram))
        ws.append(w.tolist())
        with torch.no_grad():
            for i, (n, q) in enumerate(glob.named_parameters()):
                if n.startswith("encoder."):
                    q.add_(eta * (w[0] * mean[0][i] + w[1] * mean[1][i]))
                else:  # heads.<t>.…: task t's own update, by its weight
                    t = int(n.split(".")[1])
                    q.add_(eta * w[t] * mean[t][i])
    for a, b in zip(hist.model.parameters(), glob.parameters(), strict=True):
        assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=1e-10)
    np.testing.assert_allclose([r["weights"] for r in hist.rounds], ws, rtol=1e-9, atol=1e-12)
    assert len({tuple(np.round(w, 9)) for w in ws}) > 1
