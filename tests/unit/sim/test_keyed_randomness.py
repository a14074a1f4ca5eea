"""Every random draw inside a user's ``forward`` follows the run's seed, or is refused before round 1.

Before, ``F.dropout`` in ``forward`` drew from torch's global generator (results changed with
``torch.manual_seed`` and the engines disagreed), and two ``nn.Dropout`` layers with different ``p``
were refused. Now ``F.dropout`` calls are keyed like ``nn.Dropout`` (a keep-mask per call site from the
run's plans, :mod:`fedhv.sim.keyed`), each site keeps its own rate, and any other random call is
refused with a one-line error naming it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedhv

TASKS = [fedhv.Task("c", size=3), fedhv.Task("r", "regression", 1)]


class FunctionalDropout(nn.Module):
    """Two ``F.dropout`` calls with different rates, the second one per head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 16), nn.Tanh())
        self.heads = nn.ModuleList([nn.Linear(16, 3), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = F.dropout(self.encoder(x), 0.3, self.training)
        return [head(F.dropout(h, 0.1, training=self.training)) for head in self.heads]


class TwoRates(nn.Module):
    """``nn.Dropout`` layers with different ``p``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Dropout(0.4))
        self.heads = nn.ModuleList([nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 3)), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        return [head(h) for head in self.heads]


def _data() -> fedhv.FederatedDataset:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 5, generator=g, dtype=torch.float64)
    y, v = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long(), x[:, 2:3] - x[:, 3:4]
    return fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition=[list(range(c, 64, 4)) for c in range(4)])


def _run(net: type[nn.Module], engine: str, global_seed: int, method=None, **kw) -> torch.Tensor:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = net().double()
    torch.manual_seed(global_seed)  # the user's global seed: must not matter
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the sequential engine
        hist = fedhv.simulate(model, _data(), method or fedhv.FedHV(), rounds=2, clients_per_round=3, local_steps=3,
                              batch_size=8, lr_local=0.1, engine=engine, progress=False, **kw)
    assert hist.engine == engine
    return torch.cat([p.detach().reshape(-1) for p in hist.model.parameters()])


@pytest.mark.parametrize("net", [FunctionalDropout, TwoRates])
def test_the_global_torch_seed_does_not_change_a_run(net: type[nn.Module]) -> None:
    assert torch.equal(_run(net, "batched", 1), _run(net, "batched", 2))
    assert torch.equal(_run(net, "sequential", 1), _run(net, "sequential", 2))


@pytest.mark.parametrize("net", [FunctionalDropout, TwoRates])
@pytest.mark.parametrize("method", [fedhv.FedHV(), fedhv.Uniform()], ids=lambda m: type(m).__name__)
def test_batched_equals_sequential_with_keyed_dropout(net: type[nn.Module], method) -> None:  # type: ignore[no-untyped-def]
    torch.testing.assert_close(_run(net, "batched", 1, method), _run(net, "sequential", 2, method),
                               atol=1e-12, rtol=1e-12)


def test_dropout_is_in_effect_and_each_site_keeps_its_rate() -> None:
    """The keyed dropouts drop (a run differs from the same model without dropout), and each site's
    keep-mask is drawn with its own probability."""
    from fedhv.sim.module import ModuleAdapter
    from fedhv.sim.plan import client_plan

    class NoDropout(FunctionalDropout):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            h = self.encoder(x)
            return [head(h) for head in self.heads]

    assert not torch.equal(_run(FunctionalDropout, "batched", 1), _run(NoDropout, "batched", 1))
    x = torch.randn(4, 5, dtype=torch.float64)
    for net, rates in ((FunctionalDropout, {"F.dropout#0": 0.3, "F.dropout#1": 0.1, "F.dropout#2": 0.1}),
                       (TwoRates, {"encoder.2": 0.4, "heads.0.0": 0.1})):
        adapter = ModuleAdapter(net().double(), ("c", "r"), x)
        assert adapter.dropout_rates() == rates and set(adapter.dropout_sites()) == set(rates)
        plan = client_plan(0, "train", 0, 0, torch.arange(64), 200, 50, None, adapter.dropout_sites(),
                           adapter.dropout_rates())
        for site, p in rates.items():
            assert float(plan.masks[site].float().mean()) == pytest.approx(1 - p, abs=0.01), site


class Noisy(nn.Module):
    def __init__(self, call) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.call = call
        self.attention = nn.MultiheadAttention(4, 2, dropout=0.2, batch_first=True)
        self.encoder = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 16, 8))
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.call(self, x.view(-1, 1, 4, 4))
        h = self.encoder(h)
        return [head(h) for head in self.heads]


RANDOM_CALLS = [
    (lambda m, x: x + 0.1 * torch.randn_like(x) if m.training else x, "torch.randn_like"),
    (lambda m, x: x * torch.rand(x.shape).lt(0.5) if m.training else x, "torch.rand"),
    (lambda m, x: x * torch.bernoulli(torch.full_like(x, 0.5)), "torch.bernoulli"),
    (lambda m, x: x + x.clone().uniform_() if m.training else x, "Tensor.uniform_"),
    (lambda m, x: F.dropout2d(x, 0.2, m.training), "F.dropout2d"),
    (lambda m, x: F.alpha_dropout(x, 0.2, m.training), "F.alpha_dropout"),
    (lambda m, x: F.rrelu(x, training=m.training), "F.rrelu"),
    # a library function's own draw, found at the dispatch level (a seeded ATen op inside it)
    (lambda m, x: m.attention(*[x.view(-1, 4, 4)] * 3)[0].reshape(x.shape),
     "torch.nn.functional.multi_head_attention_forward \\(random op aten.bernoulli_"),
]


@pytest.mark.parametrize(("call", "name"), RANDOM_CALLS, ids=[name.split()[0] for _, name in RANDOM_CALLS])
def test_other_random_calls_are_refused_before_round_one_naming_the_call(call, name: str) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 16, generator=g)
    data = fedhv.FederatedDataset.from_tensors(x, [(x[:, 0] > 0).long(), x[:, 1:2]], TASKS,
                                               partition=[list(range(16)), list(range(16, 32))])
    rounds = []
    with pytest.raises(fedhv.ConfigError, match=rf"forward calls {name}.*in train mode: .*use nn.Dropout or F.dropout"):
        fedhv.simulate(Noisy(call), data, fedhv.Uniform(), rounds=1, batch_size=4, progress=False,
                       callback=lambda r, rec: rounds.append(r))
    assert rounds == []  # before round 1


def test_functional_dropout_of_a_weight_is_refused() -> None:
    class DropConnect(FunctionalDropout):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            w = F.dropout(self.heads[0].weight, 0.2, self.training)
            h = self.encoder(x)
            return [h @ w.T, self.heads[1](h)]

    with pytest.raises(fedhv.ConfigError, match=r"F.dropout call 1 .*does not grow with the batch"):
        fedhv.simulate(DropConnect().double(), _data(), fedhv.Uniform(), rounds=1, progress=False)
