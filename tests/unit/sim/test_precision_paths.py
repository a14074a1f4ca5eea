"""``precision = "bf16"`` reaches every path that trains: the Python API (``fedhv.simulate``,
``fedhv.calibrate``) and a Flower node's engine, not only ``fedhv run``.

Oracles: the node must compute bit for bit what the simulator's sequential engine computes
for its client under the same precision (it runs the same code on the same samples), and
differ from fp32; the API's bf16 reports must differ from fp32 by a roundoff-sized amount:
the MLP below has L = 2 weight layers on each task's path, so its outputs carry a relative
error of at most ``2 L u`` (``u = 2^-8``, inputs and weights rounded per layer) and a loss
(cross-entropy or squared error, computed in float32 from those outputs) at most twice
that: ``|F_bf16 - F_fp32| <= 4 L u max|F|``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import fedhv
from fedhv.config import dumps, to_dict
from fedhv.errors import ConfigError
from fedhv.experiment.setup import make_engine, new_model
from fedhv.flower.node import StageOrder, worker_for
from fedhv.models import get_flat

from helpers import small_config, small_data

U_BF16 = 2.0**-8


def _node_report(precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(node's report, simulator's report) of client 2 at the initial model."""
    cfg = small_config('engine="sequential"', f'precision="{precision}"')
    node = worker_for(dumps(to_dict(cfg)), 2, cfg.partition.clients)
    theta = get_flat(node.model).clone()
    order = StageOrder(round=0, seed=cfg.seed, stream="train", report="all", gradients=None, train=None,
                       first_step_held=False, stage=0)
    got = node.serve(theta, order, None).report
    data = small_data(cfg)
    engine = make_engine(cfg, new_model(cfg, data, cfg.seed), data, cfg.seed, "train")
    want = engine.reports(theta, np.array([2]), 0, "all")[0].numpy()
    assert got is not None
    return got, want


@pytest.mark.needs_data
def test_flower_node_runs_the_configured_precision() -> None:
    bf16, sim_bf16 = _node_report("bf16")
    fp32, sim_fp32 = _node_report("fp32")
    np.testing.assert_array_equal(bf16, sim_bf16)
    np.testing.assert_array_equal(fp32, sim_fp32)
    assert np.abs(bf16 - fp32).max() > 0  # bf16 really ran on the node


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(16, 3), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.enc(x)
        return [head(h) for head in self.heads]


def _data() -> fedhv.FederatedDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(240, 6, generator=g)
    cls, reg = x[:, :3].argmax(1), x[:, 3:5].sum(1)
    tasks = [fedhv.Task("cls", "classification", 3), fedhv.Task("reg", "regression", 1)]
    return fedhv.FederatedDataset.from_tensors(x, [cls, reg], tasks, clients=6, samples_per_client=40)


@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_api_simulate_and_calibrate_run_bf16(engine: str) -> None:
    kw = {"rounds": 2, "clients_per_round": 4, "local_steps": 2, "batch_size": 8, "seed": 3, "engine": engine}
    method = fedhv.FedHV(calibration_rounds=1)
    runs = {p: fedhv.simulate(_Net(), _data(), method, precision=p, **kw) for p in ("fp32", "bf16")}
    f32, b16 = (np.array([r["report"] for r in runs[p].rounds]) for p in ("fp32", "bf16"))
    diff = np.abs(b16[0] - f32[0]).max()  # round 1: both at the same initial model
    assert 0 < diff <= 4 * 2 * U_BF16 * np.abs(f32[0]).max(), diff
    cal = {p: fedhv.calibrate(_Net(), _data(), rounds=1, clients_per_round=4, local_steps=2, batch_size=8,
                              engine=engine, precision=p).max_report for p in ("fp32", "bf16")}
    assert cal["fp32"] != cal["bf16"]


def test_api_precision_errors_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match=r"precision = 'fp8' is unknown; use \"fp32\" or \"bf16\""):
        fedhv.simulate(_Net(), _data(), fedhv.Uniform(), rounds=1, precision="fp8")
    with pytest.raises(ConfigError, match=r"precision = \"bf16\" needs a float32 model .*torch.float64"):
        fedhv.simulate(_Net().double(), _data(), fedhv.Uniform(), rounds=1, precision="bf16")
