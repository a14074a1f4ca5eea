"""The public Python API: own module + tensors through fedhv.simulate / fedhv.calibrate."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import fedhv
from fedhv.errors import FedHVError

from conftest import REPO


class Net(nn.Module):
    """A standard two-task MLP with nn.Dropout (no fedhv base class)."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        mid: nn.Module = nn.BatchNorm1d(16) if norm else nn.Dropout(0.3)
        self.enc = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), mid)
        self.heads = nn.ModuleList([nn.Linear(16, 3), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.enc(x)
        return [head(h) for head in self.heads]


def _data(n: int = 240, **kw: object) -> fedhv.FederatedDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    cls, reg = x[:, :3].argmax(1), x[:, 3:5].sum(1)
    tasks = [fedhv.Task("cls", "classification", 3), fedhv.Task("reg", "regression", 1)]
    return fedhv.FederatedDataset.from_tensors(x, [cls, reg], tasks, test=(x[:60], [cls[:60], reg[:60]]), **kw)


def _model(norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return Net(norm).double()


def _flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def test_dropout_module_batched_equals_sequential_float64() -> None:
    data = _data(clients=6, samples_per_client=40)
    kw = {"rounds": 3, "clients_per_round": 4, "local_steps": 3, "batch_size": 8, "momentum": 0.5, "seed": 3}
    method = fedhv.FedHV(lr_global=1.2, calibration_rounds=2)
    seq = fedhv.simulate(_model(), data, method, engine="sequential", **kw)
    bat = fedhv.simulate(_model(), data, method, engine="batched", **kw)
    assert bat.engine == "batched" and seq.engine == "sequential"
    assert (_flat(seq.model) - _flat(bat.model)).abs().max() < 1e-10
    assert seq.reference == pytest.approx(bat.reference, abs=1e-12)
    ws, wb = (torch.tensor([r["weights"] for r in h.rounds]) for h in (seq, bat))
    assert (ws - wb).abs().max() < 1e-10
    assert len(bat.evaluations) == 3 and (_flat(bat.model) - _flat(_model())).abs().max() > 1e-3
    # dropout is really on in training (keyed masks): without it the run differs
    nodrop = _model()
    nodrop.enc[2].p = 0.0
    other = fedhv.simulate(nodrop, data, method, engine="batched", **kw)
    assert (_flat(other.model) - _flat(bat.model)).abs().max() > 1e-6


def test_batchnorm_runs_batched_without_a_fallback_warning() -> None:
    """BatchNorm's running statistics are batched per model copy (issue 27); before, vmap failed on
    them and the run fell back to the sequential engine, never updating the statistics."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = fedhv.simulate(_model(norm=True), _data(clients=4, samples_per_client=40), fedhv.Uniform(),
                              rounds=1, clients_per_round=2, local_steps=1, batch_size=8, progress=False)
    assert hist.engine == "batched" and not [w for w in caught if "vmap" in str(w.message)]
    stats = [b for n, b in hist.model.named_buffers() if n.endswith("running_mean")]
    assert stats and all(float(b.abs().sum()) > 0 for b in stats)


@pytest.mark.parametrize("method", [fedhv.Uniform(), fedhv.FSMGDA(), fedhv.FedCMOO(), fedhv.FedHV(reference=[3, 3])])
def test_every_method_runs_on_a_plain_module(method: object, tmp_path: object) -> None:
    hist = fedhv.simulate(_model(), _data(clients=4, samples_per_client=40), method, rounds=2,  # type: ignore[arg-type]
                          clients_per_round=2, local_steps=2, batch_size=8, out=tmp_path / "run")  # type: ignore[operator]
    assert len(hist.rounds) == 2 and hist.evaluations[-1]["round"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())  # type: ignore[operator]
    assert summary["rounds"] == 2 and len((tmp_path / "run" / "rounds.jsonl").read_text().splitlines()) == 2  # type: ignore[operator]


def test_calibrate_without_runconfig_is_max_report_plus_margin() -> None:
    cal = fedhv.calibrate(_model(), _data(clients=4, samples_per_client=40), rounds=2, margin=0.2,
                          clients_per_round=2, local_steps=2, batch_size=8)
    rows = torch.tensor(cal.reports["0"], dtype=torch.float64)
    assert rows.shape == (2, 2)
    assert cal.reference == pytest.approx((rows.max(0).values + 0.2).tolist(), abs=1e-12)


def test_partitions_index_lists_ids_and_errors() -> None:
    lists = _data(partition=[[0, 1, 2, 3, 4, 5, 6, 7], list(range(8, 30))])
    assert lists.num_clients == 2 and len(lists.parts[1]) == 22
    ids = torch.arange(240) % 5
    by_id = _data(partition="ids", ids=ids)
    assert by_id.num_clients == 5 and all(bool((ids[by_id.parts[c]] == c).all()) for c in range(5))
    hist = fedhv.simulate(_model(), by_id, fedhv.Uniform(), rounds=1, clients_per_round=5, local_steps=1,
                          batch_size=8)
    assert sorted(hist.rounds[0]["clients"]) == [0, 1, 2, 3, 4]
    with pytest.raises(FedHVError, match=r"partition\[1\]"):
        _data(partition=[[0, 1], [500]])
    with pytest.raises(FedHVError, match="clients_per_round = 9"):
        fedhv.simulate(_model(), by_id, fedhv.Uniform(), rounds=1, clients_per_round=9)
    with pytest.raises(FedHVError, match="targets has shape"):
        fedhv.FederatedDataset.from_tensors(torch.zeros(4, 6), torch.zeros(4, 3), ["a", "b"])


def test_task_losses_per_kind_golden_values() -> None:
    from fedhv.api.tasks import TaskObjective

    obj = TaskObjective((fedhv.Task("c", "classification", 2), fedhv.Task("m", "multilabel", 2),
                         fedhv.Task("r", "regression", 1)))
    outs = [torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 2.0]]), torch.tensor([[1.5]])]
    y = torch.tensor([[1.0, 1.0, 0.0, 0.5]])
    losses, scores = obj.per_sample(outs, y)
    bce = (torch.log(torch.tensor(2.0)) + torch.nn.functional.softplus(torch.tensor(2.0))) / 2
    assert losses[0].tolist() == pytest.approx([float(torch.log(torch.tensor(2.0))), float(bce), 1.0])
    # argmax of a tie is class 0 (wrong); attribute 1: 0 > 0 false == 1? no, attribute 2: 2 > 0 true == 0? no;
    # regression: the squared error itself (metric "mse", lower is better)
    assert scores[0].tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_public_names_and_no_torch_for_results() -> None:
    assert set(fedhv.__all__) >= {"Task", "FederatedDataset", "calibrate", "simulate", "History", "FedHV",
                                  "Uniform", "FSMGDA", "FedCMOO", "HVWeighting"}
    code = "import sys, fedhv, fedhv.results.tables; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_example_own_mlp_runs_end_to_end() -> None:

    script = REPO / "examples" / "own_mlp.py"
    done = subprocess.run([sys.executable, str(script), "--small"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "engine batched" in done.stdout and "round 3:" in done.stdout
