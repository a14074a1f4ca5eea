"""Local training options (issue 27, item 8): optimizer, local epochs, clipping, sample-weighted
aggregation -- against plain-PyTorch oracles, and batched == sequential in float64.

Before issue 27 the local update was fixed (SGD + momentum, K steps) and updates were always
the unweighted mean: every test here fails on that code (the options did not exist).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import fedhv


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def _tensors(n: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long(), x[:, 2:3] - x[:, 3:4]


TASKS = [fedhv.Task("c", size=3), fedhv.Task("r", "regression", 1)]


def _one_client_oracle(model: nn.Module, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, steps: int,
                       make_opt, clip: float | None = None) -> nn.Module:
    """Plain PyTorch: full-batch steps on (CE + MSE) / 2, the uniform weights of Uniform."""
    m = copy.deepcopy(model)
    opt = make_opt(m.parameters())
    for _ in range(steps):
        opt.zero_grad()
        o1, o2 = m(x)
        loss = 0.5 * nn.functional.cross_entropy(o1, y) + 0.5 * nn.functional.mse_loss(o2, v)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
    return m


@pytest.mark.parametrize(("kw", "make_opt", "clip"), [
    ({"optimizer": "adam", "optimizer_options": {"weight_decay": 0.01}},
     lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.01), None),
    ({"optimizer": torch.optim.AdamW, "optimizer_options": {"betas": (0.8, 0.9)}},
     lambda p: torch.optim.AdamW(p, lr=0.05, betas=(0.8, 0.9)), None),
    ({"momentum": 0.9, "clip_grad_norm": 0.05}, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), 0.05),
    ({"optimizer": "rmsprop", "clip_grad_norm": 0.1}, lambda p: torch.optim.RMSprop(p, lr=0.05), 0.1),
])
@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_one_client_one_round_equals_a_plain_pytorch_loop(engine: str, kw: dict, make_opt, clip) -> None:
    """A client holding exactly one batch trains on all of it every step (the batch order does not
    change a mean loss), so one Uniform round with eta_g = 1 is K plain PyTorch steps."""
    x, y, v = _tensors(16)
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=[list(range(16))])
    torch.manual_seed(0)
    model = Net().double()
    hist = fedhv.simulate(model, data, fedhv.Uniform(lr_global=1.0), rounds=1, clients_per_round=1, local_steps=4,
                          batch_size=16, lr_local=0.05, engine=engine, progress=False, **kw)
    oracle = _one_client_oracle(model, x, y, v, 4, make_opt, clip)
    for a, b in zip(hist.model.parameters(), oracle.parameters()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_local_epochs_set_each_clients_steps_and_engines_agree() -> None:
    x, y, v = _tensors(80)
    parts = [list(range(8)), list(range(8, 24)), list(range(24, 64)), list(range(64, 69))]
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=parts)
    runs = []
    for engine in ("batched", "sequential"):
        torch.manual_seed(0)
        runs.append(fedhv.simulate(Net().double(), data, fedhv.Uniform(), rounds=3, clients_per_round=4,
                                   batch_size=8, local_epochs=2, lr_local=0.05, momentum=0.5,
                                   optimizer_options={"nesterov": True}, engine=engine, progress=False))
    for a, b in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    # one client of exactly one batch with E epochs = E full-batch steps
    one = fedhv.FederatedDataset.from_tensors(x[:8], [y[:8], v[:8]], TASKS, partition=[list(range(8))])
    torch.manual_seed(0)
    model = Net().double()
    hist = fedhv.simulate(model, one, fedhv.Uniform(), rounds=1, clients_per_round=1, batch_size=8, local_epochs=3,
                          lr_local=0.05, progress=False)
    oracle = _one_client_oracle(model, x[:8], y[:8], v[:8], 3, lambda p: torch.optim.SGD(p, lr=0.05))
    for a, b in zip(hist.model.parameters(), oracle.parameters()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_sample_weighted_aggregation_is_the_weighted_mean_of_the_clients_updates() -> None:
    from fedhv.algorithms.uniform import UniformAlgorithm
    from fedhv.sim.engine import SequentialEngine
    from fedhv.sim.federation import SimFederation
    from fedhv.sim.module import ModuleAdapter

    x, y, v = _tensors(80)
    parts = [list(range(8)), list(range(8, 32)), list(range(32, 80))]
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=parts)
    fd = data.federated(torch.float64, "cpu")
    torch.manual_seed(0)
    adapter = ModuleAdapter(Net().double(), fd.task_names, fd.train_x[:2])
    theta = torch.cat([p.detach().reshape(-1) for p in adapter.parameters()])
    clients = np.array([0, 1, 2])
    engine = SequentialEngine(adapter, fd, local_steps=2, batch_size=8, lr_local=0.1, momentum=0.0, seed=0)
    deltas = engine.train(theta, clients, np.array([[0.5, 0.5]]), 0)[:, 0]
    expected = theta + 1.5 * (8 * deltas[0] + 24 * deltas[1] + 48 * deltas[2]) / 80
    for agg, want in (("samples", expected), ("mean", theta + 1.5 * deltas.mean(0))):
        fed = SimFederation(engine, clients, 0, aggregation=agg)
        result = UniformAlgorithm(lr_global=1.5).round(UniformAlgorithm(lr_global=1.5).init_state(2), theta, fed)
        torch.testing.assert_close(result.theta, want, atol=1e-13, rtol=1e-12)
    # and end to end: the option changes the run and is recorded
    torch.manual_seed(0)
    a = fedhv.simulate(Net().double(), data, fedhv.Uniform(), rounds=2, clients_per_round=3, batch_size=8,
                       local_steps=2, aggregation="samples", progress=False)
    torch.manual_seed(0)
    b = fedhv.simulate(Net().double(), data, fedhv.Uniform(), rounds=2, clients_per_round=3, batch_size=8,
                       local_steps=2, progress=False)
    assert not all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))


def test_options_are_recorded_and_bad_ones_refused(tmp_path) -> None:
    import tomllib

    x, y, v = _tensors(64)
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4)
    fedhv.simulate(Net().double(), data, fedhv.Uniform(), rounds=1, clients_per_round=2, batch_size=8,
                   optimizer="adamw", optimizer_options={"weight_decay": 0.1}, clip_grad_norm=1.0,
                   aggregation="samples", out=tmp_path / "r", progress=False)
    train = tomllib.loads((tmp_path / "r" / "config.toml").read_text())["train"]
    assert (train["optimizer"], train["optimizer_options"], train["clip_grad_norm"], train["aggregation"]) == (
        "adamw", {"weight_decay": 0.1}, 1.0, "samples")
    with pytest.raises(fedhv.ConfigError, match="optimizer = 'lbfgs' is not supported"):
        fedhv.simulate(Net().double(), data, optimizer="lbfgs", rounds=1, progress=False)
    with pytest.raises(fedhv.ConfigError, match="momentum = 0.9 applies to optimizer = \"sgd\" only"):
        fedhv.simulate(Net().double(), data, fedhv.Uniform(), optimizer="adam", momentum=0.9, rounds=1,
                       progress=False)
    with pytest.raises(fedhv.ConfigError, match="aggregation = 'weighted' is unknown"):
        fedhv.simulate(Net().double(), data, aggregation="weighted", rounds=1, progress=False)
    with pytest.raises(fedhv.ConfigError, match="optimizer = 'adam' with options"):
        fedhv.simulate(Net().double(), data, optimizer="adam", optimizer_options={"betaz": 1}, rounds=1,
                       progress=False)
