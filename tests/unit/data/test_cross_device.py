"""Cross-device scale (issue 31): unequal client sizes, the multimnist-xd preset, per-round cost
independent of the population size, partition statistics (chi_N(M), gradient dissimilarity) and
the Flower refusals of what only the simulator runs."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import fedhv
from fedhv.config import load_config
from fedhv.data.partition import client_sizes, dirichlet_partition
from fedhv.errors import ConfigError
from fedhv.experiment import run_experiment
from fedhv.experiment.setup import federated_data, new_model
from fedhv.stats import participation_factor
from fedhv.stats_gradients import gradient_dissimilarity

from helpers import small_config

XD_SMALL = ["partition.clients=200", "partition.samples_per_client=12", "train.clients_per_round=10",
            "train.batch_size=16", "train.local_steps=3", "calibration.rounds=2", "data.max_test_samples=300",
            "eval.test_period=2", "rounds=2"]


def test_a_partition_of_equal_sizes_given_per_client_is_the_papers_partition() -> None:
    strata = np.random.default_rng(0).integers(0, 7, 3000)
    with pytest.warns(UserWarning):  # 40 x 150 draws on 3,000 samples recycle
        paper = dirichlet_partition(strata, 40, 150, 0.3, 10)
    with pytest.warns(UserWarning):
        ragged = dirichlet_partition(strata, 40, np.full(40, 150), 0.3, 10)
    assert isinstance(ragged, list) and all(np.array_equal(a, b) for a, b in zip(paper, ragged))
    sizes = client_sizes(40, 30, 1.0, 2, 10, 3000)
    rows = dirichlet_partition(strata, 40, sizes, 0.3, 10)
    assert [len(r) for r in rows] == sizes.tolist()
    assert all(len(np.unique(r)) == len(r) for r in rows)  # distinct within a client


def test_lognormal_sizes_have_the_configured_mean_spread_and_bounds() -> None:
    sizes = client_sizes(200_000, 24, 1.0, 2, 10, 10**9)
    assert sizes.min() >= 2 and np.mean(sizes) == pytest.approx(24, rel=0.02)
    # log n is normal with sd sigma where no clipping acts: the interquartile ratio is e^(2 * 0.674 sigma)
    q1, q3 = np.percentile(sizes, [25, 75])
    assert q3 / q1 == pytest.approx(np.exp(2 * 0.6745), rel=0.1)
    assert np.array_equal(client_sizes(50, 24, 0.0, 1, 3, 1000), np.full(50, 24))
    assert client_sizes(1000, 24, 3.0, 5, 3, 100).max() == 100  # clipped to the training samples
    assert np.array_equal(client_sizes(100, 24, 1.0, 2, 7, 1000), client_sizes(100, 24, 1.0, 2, 7, 1000))


@pytest.mark.needs_data
def test_the_cross_device_partition_runs_on_both_engines_identically(tmp_path: Path) -> None:
    over = [*XD_SMALL, "partition.sizes='lognormal'", "dtype='float64'", "diagnostics.enabled=true",
            "diagnostics.probe_samples=64"]
    cfg = load_config("multimnist-xd", over)
    data = federated_data(cfg)
    sizes = [len(data.parts[c]) for c in range(data.num_clients)]
    assert min(sizes) >= 2 and len(set(sizes)) > 10 and max(sizes) > 16  # some clients below the batch of 16
    batched = run_experiment(cfg, tmp_path / "b", progress=False)
    sequential = run_experiment(load_config("multimnist-xd", [*over, "engine='sequential'"]), tmp_path / "s",
                                progress=False)
    assert batched["task_loss"] == pytest.approx(sequential["task_loss"], rel=1e-9)
    entry = json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[-1])
    score = entry["diagnostics"]["clients"]["score"][0]
    assert score["worst"] <= score["p10"] <= score["mean"] <= score["best"]


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(16, 2), nn.Linear(16, 2)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.body(x)
        return [head(h) for head in self.heads]


def _round_allocations(clients: int) -> list[int]:
    """Bytes Python and numpy allocate at the peak of each round (above what was live when the round began;
    ``tracemalloc``), rounds 2 to 15 of a 16-round run of N = ``clients`` (the first round builds the run,
    the last evaluates)."""
    g = torch.Generator().manual_seed(0)
    n = 2 * clients + clients // 2  # half the clients hold 3 samples, half 2: unequal sizes
    x = torch.randn(n, 8, generator=g)
    y = torch.stack([(x[:, 0] > 0).long(), (x[:, 1] > 0).long()], 1)
    data = fedhv.FederatedDataset.from_tensors(x, y, ["a", "b"], partition="ids", ids=torch.arange(n) % clients)
    torch.manual_seed(0)
    extra: list[int] = []
    live = [0]

    def after_round(_round: int, _record: dict) -> None:
        extra.append(tracemalloc.get_traced_memory()[1] - live[0])
        tracemalloc.reset_peak()
        live[0] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        live[0] = tracemalloc.get_traced_memory()[0]
        fedhv.simulate(_Net(), data, method=fedhv.Uniform(1.0), rounds=16, clients_per_round=20, local_steps=2,
                       batch_size=4, progress=False, eval_every=1000, callback=after_round)
    finally:
        tracemalloc.stop()
    return extra[1:15]


def test_a_round_allocates_nothing_that_grows_with_the_population() -> None:
    """Rounds touch the M sampled clients only: at N = 100,000 a round (sampling, training, aggregation,
    bookkeeping) allocates at most 256 KiB more than at N = 1,000. Measured here: about 15 KiB a round at
    both; a per-round pass over the N clients' sizes (``FederatedDataset.sampleable`` inside the round loop)
    allocates 1.5 MiB a round at N = 100,000 and fails this. Allocations, not seconds, so the load of the
    machine cannot fail it; the seconds are measured in ``perf/scale.py``. (Torch's own allocator is not
    traced; the round's Python and numpy bookkeeping, where a pass over N would live, is.)"""
    small, large = _round_allocations(1_000), _round_allocations(100_000)
    assert max(large) <= max(small) + 256 * 1024, (small, large)


def test_participation_factor_golden_values() -> None:
    assert participation_factor(30, 20) == pytest.approx(10 / (20 * 29))
    assert participation_factor(30, 30) == 0.0
    assert participation_factor(10_000, 100) == pytest.approx(9_900 / (100 * 9_999))
    assert participation_factor(1, 1) == 0.0


@pytest.mark.needs_data
def test_gradient_dissimilarity_equals_a_brute_force_loop() -> None:
    cfg = small_config()
    report = gradient_dissimilarity(cfg)
    data = federated_data(cfg)
    model = new_model(cfg, data, cfg.seed).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []  # per client and task: the gradient of the client's mean loss
    for k in range(data.num_clients):
        rows = data.parts[k]
        losses, _ = data.objective.per_sample(model(data.train_x[rows]), data.train_y[rows])
        grads.append([torch.cat([g.reshape(-1) for g in torch.autograd.grad(losses[:, i].mean(), params,
                                                                             retain_graph=True)]).double()
                      for i in range(data.num_tasks)])
    for i in range(data.num_tasks):
        g = torch.stack([row[i] for row in grads])
        mean = g.mean(0)
        zeta = float(((g - mean) ** 2).sum(1).mean())
        assert report["zeta_sq"][i] == pytest.approx(zeta, rel=1e-4)
        assert report["grad_sq"][i] == pytest.approx(float((mean ** 2).sum()), rel=1e-4)
        assert report["chi_zeta_sq"][i] == pytest.approx(participation_factor(6, 4) * zeta, rel=1e-4)
    assert report["clients_used"] == report["clients"] == 6
    sampled = gradient_dissimilarity(cfg, clients=3)  # a seeded subset: finite, same order of magnitude
    assert sampled["clients_used"] == 3 and all(0 < z < 10 * report["zeta_sq"][0] for z in sampled["zeta_sq"])


@pytest.mark.needs_data
def test_partition_stats_prints_chi_sizes_and_dissimilarity(capsys: pytest.CaptureFixture[str]) -> None:
    from fedhv.cli import main

    assert main(["partition-stats", "multimnist-xd", *[a for o in XD_SMALL[:3] for a in ("--set", o)],
                 "--gradients", "--grad-clients", "20"]) == 0
    out = capsys.readouterr().out
    assert f"chi_N(M) = (N - M) / (M (N - 1)) = {participation_factor(200, 10):.6g}" in out
    assert "client sizes (lognormal): min 2" in out and "over 20 of 200 clients" in out
    assert "(the first 60 clients below; 140 more with --format json)" in out


def test_flower_refuses_unequal_sizes_and_diagnostics() -> None:
    from fedhv.flower.runconf import local_config

    with pytest.raises(ConfigError, match="partition.sizes = 'lognormal': a SuperNode serves one equal-size"):
        local_config("multimnist-xd", 3)
    with pytest.raises(ConfigError, match="diagnostics.enabled = true needs every client's data"):
        local_config("multimnist", 3, ["diagnostics.enabled=true"])
    for key, value in (("sizes", "'uneven'"), ("size_sigma", "-1"), ("min_samples", "0")):
        with pytest.raises(ConfigError, match=f"partition.{key} = "):
            load_config("multimnist-xd", [f"partition.{key}={value}"])


@pytest.mark.needs_data
def test_scale_script_runs_and_splits_each_round(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import REPO

    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(REPO / "perf" / "scale.py"), "--clients", "300", "--per-round",
                           "5,400", "--rounds", "1", "--json", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result,) = json.loads(out.read_text())
    assert result["clients"] == 300 and result["build_s"] > 0 and result["peak_rss_gib"] > 0.1
    assert [(c["clients_per_round"], c["method"]) for c in result["cells"]] == [(5, "uniform"), (5, "fedhv")]
    for c in result["cells"]:  # M = 400 > N is left out; the split adds up
        assert c["train_s"] > 0 and c["round_s"] == pytest.approx(c["train_s"] + c["server_s"] + c["other_s"])
    assert "| 300 | " in proc.stdout and "| – | – |" in proc.stdout
