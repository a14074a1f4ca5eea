"""Frozen parameters (``requires_grad=False``) stay frozen: fine-tuning a pretrained encoder.

Before, the batched engine turned every parameter into one trainable flat vector, so a frozen
encoder layer and a frozen head moved (while the sequential engine left them alone, and FedCMOO's
sequential gradients crashed on them); the updates, the bytes sent and the checkpoints carried them.
Now ``theta`` holds the trainable parameters only (:mod:`fedhv.models.params`): checked here
against a plain-PyTorch replay of the rounds, on both engines, for every method, and on a Flower
node's worker.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import fedhv

TASKS = [fedhv.Task("c", size=3), fedhv.Task("r", "regression", 1)]
CLIENTS, B = 4, 8
FROZEN = ("encoder.0.weight", "encoder.0.bias", "heads.1.bias")


class Net(nn.Module):
    """A two-task MLP; the first encoder layer and the regression head's bias are frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def _frozen_net() -> Net:
    torch.manual_seed(0)
    model = Net().double()
    model.encoder[0].requires_grad_(False)
    model.heads[1].bias.requires_grad_(False)
    return model


def _tensors(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long(), x[:, 2:3] - x[:, 3:4]


def _one_batch_clients() -> tuple[fedhv.FederatedDataset, list[list[int]]]:
    """Every client holds exactly one batch: each local step trains on all of it, whatever the plan's order."""
    x, y, v = _tensors(CLIENTS * B)
    parts = [list(range(c, CLIENTS * B, CLIENTS)) for c in range(CLIENTS)]
    return fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=parts), parts


def _replay(model: nn.Module, data: fedhv.FederatedDataset, parts: list[list[int]], rounds: int, steps: int,
            lr: float, momentum: float) -> nn.Module:
    """Plain PyTorch FedAvg of Uniform (weights 1/2, eta_g = 1, every client every round): each client takes
    ``steps`` SGD steps by hand on (CE + MSE) / 2 over its batch, starting from the global model; the global
    model moves by the mean update. Only the parameters with ``requires_grad`` are stepped."""
    glob = copy.deepcopy(model)
    x, (y, v) = data.x, (data.y[:, 0].long(), data.y[:, 1:])
    for _ in range(rounds):
        deltas = []
        for idx in parts:
            m = copy.deepcopy(glob)
            params = [p for p in m.parameters() if p.requires_grad]
            bufs = [torch.zeros_like(p) for p in params]
            for _ in range(steps):
                o1, o2 = m(x[idx])
                loss = 0.5 * nn.functional.cross_entropy(o1, y[idx]) + 0.5 * nn.functional.mse_loss(o2, v[idx])
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    for p, g, buf in zip(params, grads, bufs):
                        buf.mul_(momentum).add_(g)
                        p.sub_(lr * buf)
            deltas.append([q.detach() - p.detach() for p, q in zip(glob.parameters(), m.parameters())])
        with torch.no_grad():
            for j, p in enumerate(glob.parameters()):
                p.add_(torch.stack([d[j] for d in deltas]).mean(0))
    return glob


@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_frozen_encoder_and_head_equal_a_plain_pytorch_replay(engine: str) -> None:
    data, parts = _one_batch_clients()
    model = _frozen_net()
    init = copy.deepcopy(model.state_dict())
    hist = fedhv.simulate(model, data, fedhv.Uniform(), rounds=3, clients_per_round=CLIENTS, local_steps=3,
                          batch_size=B, lr_local=0.2, momentum=0.5, engine=engine, progress=False)
    assert hist.engine == engine
    oracle = _replay(model, data, parts, rounds=3, steps=3, lr=0.2, momentum=0.5)
    got, want = hist.model.state_dict(), oracle.state_dict()
    for name in FROZEN:
        assert torch.equal(got[name], init[name]), name  # bit-identical to the initial values
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-12, rtol=1e-12, msg=name)
    assert float((got["heads.0.weight"] - init["heads.0.weight"]).abs().max()) > 1e-3  # the rest learned
    # History.model keeps the user's flags, and the bytes a client sends and receives count the trainable ones only
    assert [n for n, p in hist.model.named_parameters() if not p.requires_grad] == list(FROZEN)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable < sum(p.numel() for p in model.parameters())
    assert hist.rounds[0]["bytes_down_per_client"] == hist.rounds[0]["bytes_up_per_client"] == 8 * trainable


@pytest.mark.parametrize("method", [fedhv.FedHV(), fedhv.FSMGDA(), fedhv.FedCMOO()], ids=lambda m: type(m).__name__)
def test_every_method_leaves_frozen_parameters_alone_and_the_engines_agree(method) -> None:  # type: ignore[no-untyped-def]
    x, y, v = _tensors(64)
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=[list(range(c, 64, 4)) for c in range(4)])
    runs = {}
    for engine in ("batched", "sequential"):
        model = _frozen_net()
        init = copy.deepcopy(model.state_dict())
        hist = fedhv.simulate(model, data, method, rounds=2, clients_per_round=3, local_steps=2, batch_size=8,
                              lr_local=0.1, engine=engine, progress=False)
        assert hist.engine == engine
        state = hist.model.state_dict()
        for name in FROZEN:
            assert torch.equal(state[name], init[name]), (engine, name)
        assert not torch.equal(state["heads.0.weight"], init["heads.0.weight"])
        runs[engine] = state
    for name, value in runs["batched"].items():
        torch.testing.assert_close(value, runs["sequential"][name], atol=1e-12, rtol=1e-12, msg=name)


def test_a_model_with_nothing_trainable_is_refused_in_one_line() -> None:
    x, y, v = _tensors(32)
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=[list(range(16)), list(range(16, 32))])
    model = Net().double().requires_grad_(False)
    with pytest.raises(fedhv.ConfigError, match=r"no trainable parameter .*requires_grad=False.*leave at least one"):
        fedhv.simulate(model, data, fedhv.Uniform(), rounds=1, progress=False)


def test_a_flower_node_neither_receives_nor_moves_frozen_parameters() -> None:
    """The node's worker (what a SuperNode runs for every stage): the model it is sent is the trainable
    vector; FedCMOO's stages (gradients, then training from the held gradients) leave the frozen ones alone."""
    from fedhv.flower.node import NodeTrust, NodeWorker, StageOrder
    from fedhv.models import get_flat

    ref = "frozen_benchmark:make_benchmark"
    text = f"""setting = "frozen"
method = "uniform"
rounds = 1
dtype = "float64"
engine = "sequential"
[data]
benchmark = "{ref}"
[partition]
clients = 3
samples_per_client = 60
[train]
clients_per_round = 3
batch_size = 8
local_steps = 2
[lr.uniform]
global = 1.0
local = 0.05
"""
    worker = NodeWorker(text, 1, 3, trust=NodeTrust(frozenset({ref})))
    model = worker.model.module
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert set(frozen) == {"encoder.1.weight", "encoder.1.bias", "heads.1.bias"}
    theta = get_flat(worker.model)
    assert theta.numel() == sum(p.numel() for p in model.parameters() if p.requires_grad)
    order = StageOrder(round=0, stream="train", seed=0, report=None, gradients=np.eye(2), train=None)
    grads = torch.from_numpy(worker.serve(theta, order, None).gradients)
    assert grads.shape == (2, theta.numel())
    order = StageOrder(round=0, stream="train", seed=0, report=None, gradients=None, train=np.array([[0.5, 0.5]]),
                       first_step_held=True)
    deltas = torch.from_numpy(worker.serve(theta, order, grads).deltas)
    assert deltas.shape == (1, theta.numel()) and float(deltas.abs().max()) > 0
    for name, value in frozen.items():
        assert torch.equal(dict(model.named_parameters())[name], value), name
