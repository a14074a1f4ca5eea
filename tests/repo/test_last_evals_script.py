"""``perf/last_evals.py``: the last scheduled evaluations of a real (small) run, recomputed here from the
run's ``History`` — the extra final evaluation after a round that is not on the schedule is left out."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import fedhv

from conftest import REPO

SCRIPT = REPO / "perf" / "last_evals.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("last_evals", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(6, 12), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(12, 2), nn.Linear(12, 3)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.enc(x)
        return [head(h) for head in self.heads]


def test_last_scheduled_evaluations_of_a_real_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(400, 6)
    a, b = (x[:, 0] > 0).long(), torch.bucketize(x[:, 1].contiguous(), torch.tensor([-0.4, 0.4]))
    data = fedhv.FederatedDataset.from_tensors(x, [a, b], [fedhv.Task("a", size=2), fedhv.Task("b", size=3)],
                                               partition="dirichlet-disjoint", clients=8, test=(x[:100], [a[:100], b[:100]]))
    history = fedhv.simulate(_Net(), data, fedhv.Uniform(), rounds=20, eval_every=3, clients_per_round=4,
                             lr_local=0.3, out=tmp_path / "run", progress=False)
    script = _script()
    records = script.last_evaluations(tmp_path / "run", until=20, last=4)
    scheduled = [e for e in history.evaluations if e["round"] % 3 == 0]
    assert 20 in [e["round"] for e in history.evaluations]  # the extra final evaluation exists and is skipped
    assert [r["round"] for r in records] == [e["round"] for e in scheduled[-4:]] == [9, 12, 15, 18]
    got = script.summary(records)
    assert got["MeanAcc"] == pytest.approx((statistics.fmean(e["mean_acc"] for e in scheduled[-4:]),
                                            statistics.stdev(e["mean_acc"] for e in scheduled[-4:])))
    assert got["task 1"][0] == pytest.approx(statistics.fmean(e["task_acc"][1] for e in scheduled[-4:]))
    assert [r["round"] for r in script.last_evaluations(tmp_path / "run", until=10, last=2)] == [6, 9]
    assert [r["round"] for r in script.last_evaluations(tmp_path / "run", until=18, last=2)] == [15, 18]
    with pytest.raises(SystemExit, match="fewer than --last 9 scheduled"):
        script.last_evaluations(tmp_path / "run", until=20, last=9)
