"""fedhv.FederatedDataset.from_datasets, the shared calibration rule and simulate(out=) (issue 14, items 1-3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset

import fedhv
from fedhv.api.materialize import DatasetTooLarge
from fedhv.errors import FedHVError
from fedhv.experiment.loop import RoundRecord

from conftest import REPO

TASKS = [fedhv.Task("cls", "classification", 3), fedhv.Task("reg", "regression", 1)]


def _arrays(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, x[:, :3].argmax(1), x[:, 3:5].sum(1)


class Items(Dataset):  # type: ignore[type-arg]
    """A plain map-style dataset of ``(x, (label, target)[, writer])`` items; counts its reads."""

    def __init__(self, n: int, seed: int = 1, writers: int = 0, length: int | None = None) -> None:
        self.x, self.cls, self.reg = _arrays(n, seed)
        self.writers, self.length, self.reads = writers, length, 0

    def __len__(self) -> int:
        return self.length or len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        self.reads += 1
        item = (self.x[i], (int(self.cls[i]), float(self.reg[i])))
        return (*item, f"w{i % self.writers}") if self.writers else item


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3))
        self.heads = nn.ModuleList([nn.Linear(16, 3), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.enc(x)
        return [head(h) for head in self.heads]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Net().double()


# --------------------------------------------------------------------------- item 1: from_datasets


def test_from_datasets_equals_from_tensors_with_progress_and_id_partition(capsys: pytest.CaptureFixture[str]) -> None:
    train, test = Items(200), Items(40, seed=2)
    data = fedhv.FederatedDataset.from_datasets(train, test, TASKS, clients=5, samples_per_client=40, alpha=0.4)
    ref = fedhv.FederatedDataset.from_tensors(train.x, [train.cls, train.reg], TASKS, clients=5,
                                              samples_per_client=40, alpha=0.4, test=(test.x, [test.cls, test.reg]))
    assert torch.equal(data.x, ref.x) and torch.equal(data.y, ref.y) and torch.equal(data.parts, ref.parts)
    assert data.test is not None and ref.test is not None
    assert torch.equal(data.test[0], ref.test[0]) and torch.equal(data.test[1], ref.test[1])
    assert train.reads == 200 and test.reads == 40  # read once
    err = capsys.readouterr().err
    assert "materialising train: 200/200 items (100 %)" in err and "materialising test: 40/40 items" in err
    # the natural id column: the items' third element, one client per writer
    by_writer = fedhv.FederatedDataset.from_datasets(Items(200, writers=7), None, TASKS, partition="ids",
                                                     progress=False)
    assert by_writer.num_clients == 7 and by_writer.test is None
    assert [sorted(set((by_writer.parts[c] % 7).tolist())) for c in range(7)] == [[c] for c in range(7)]
    assert capsys.readouterr().err == ""


def test_from_datasets_that_do_not_fit_are_refused_before_loading() -> None:
    train, test = Items(50), Items(20, seed=2)
    # x: 6 float32 = 24 bytes, y: 2 float64 columns = 16 bytes -> (50 + 20) * 40 = 2800 bytes
    with pytest.raises(DatasetTooLarge, match=r"max_bytes = 1000 .* ~2800 bytes"):
        fedhv.FederatedDataset.from_datasets(train, test, TASKS, max_bytes=1000)
    assert train.reads == 1 and test.reads == 1  # only the first items, for the estimate
    huge = Items(10, length=10**14)  # ~4 PB as tensors; the default limit is half of the available memory
    with pytest.raises(FedHVError, match="half of the available memory"):
        fedhv.FederatedDataset.from_datasets(huge, None, TASKS)
    assert huge.reads == 1


def test_from_datasets_rejects_items_it_cannot_stack() -> None:
    class Ragged(Items):
        def __getitem__(self, i: int) -> tuple[Any, ...]:
            x, y = super().__getitem__(i)
            return (x[:5] if i == 3 else x), y

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from ()

    with pytest.raises(FedHVError, match=r"train\[3\] has x of shape \(5,\) but train\[0\] has \(6,\)"):
        fedhv.FederatedDataset.from_datasets(Ragged(10), None, TASKS, progress=False)
    with pytest.raises(FedHVError, match="not a map-style dataset"):
        fedhv.FederatedDataset.from_datasets(Stream(), None, TASKS)
    with pytest.raises(FedHVError, match=r"train\[0\] has 2 target values; the tasks need 3"):
        fedhv.FederatedDataset.from_datasets(Items(10), None, [*TASKS, fedhv.Task("r2", "regression", 1)])
    with pytest.raises(FedHVError, match="partition = \"ids\" needs one client id per sample"):
        fedhv.FederatedDataset.from_datasets(Items(10), None, TASKS, partition="ids", progress=False)


# --------------------------------------------------------------------------- item 2: one calibration rule


def _rec(rnd: int, report: list[float], clients: int) -> RoundRecord:
    return RoundRecord(rnd, list(range(clients)), {"report": report}, 0.0, 0.0, 100, 7, 1)


def test_calibration_rule_golden_values() -> None:
    from fedhv.experiment.calibration import calibration_from_records

    records = {"0": [_rec(1, [1.0, 2.0], 3), _rec(2, [1.5, 1.0], 3)], "42": [_rec(1, [0.5, 2.5], 2)]}
    cal = calibration_from_records(records, margin=0.25, seconds=1.5, seeds=[0, 42])
    assert cal.max_report == [1.5, 2.5]  # max over both seeds and all rounds, per task
    assert cal.reference == [1.75, 2.75]  # + margin (exact in binary)
    assert cal.reports == {"0": [[1.0, 2.0], [1.5, 1.0]], "42": [[0.5, 2.5]]}
    assert (cal.rounds, cal.seeds, cal.seconds) == (3, [0, 42], 1.5)
    assert (cal.bytes_down, cal.bytes_up) == (100 * (3 + 3 + 2), 7 * 8)
    with pytest.raises(FedHVError, match="no rounds"):
        calibration_from_records({"0": []}, 0.15)


def test_api_calibration_counts_bytes_and_uses_the_report_rule_of_the_run() -> None:
    data = fedhv.FederatedDataset.from_tensors(*_split(240), TASKS, clients=4, samples_per_client=40)
    kw: dict[str, Any] = {"rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 8}
    cal = fedhv.calibrate(_model(), data, **kw)
    # 180 float64 parameters down per client and round; up: the update and the 2 reports
    assert (cal.bytes_down, cal.bytes_up) == (2 * 2 * 180 * 8, 2 * 2 * (180 + 2) * 8)
    one = fedhv.calibrate(_model(), data, report_batches=1, **kw)
    assert one.reports != cal.reports  # one minibatch per report instead of all local data
    method = fedhv.FedHV(report_batches=1, calibration_rounds=2)
    hist = fedhv.simulate(_model(), data, method, rounds=1, clients_per_round=2, local_steps=2, batch_size=8)
    assert hist.calibration is not None and hist.calibration.reports == one.reports


def _split(n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, cls, reg = _arrays(n)
    return x.double(), [cls, reg]


# --------------------------------------------------------------------------- item 3: simulate(out=)


def _small(tmp: Path) -> fedhv.FederatedDataset:
    x, ys = _split(240)
    return fedhv.FederatedDataset.from_tensors(x, ys, TASKS, clients=4, samples_per_client=40,
                                               test=(x[:60], [y[:60] for y in ys]))


def test_simulate_out_is_a_run_directory_that_fedhv_table_reads(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "toy-s3"
    hist = fedhv.simulate(_model(), _small(tmp_path), fedhv.FedHV(calibration_rounds=2), rounds=3, seed=3,
                          clients_per_round=2, local_steps=2, batch_size=8, eval_every=2, out=out, name="toy")
    assert hist.out == out
    names = {p.name for p in out.iterdir()}
    assert {"config.toml", "environment.json", "calibration.json", "rounds.jsonl", "metrics.jsonl", "model.pt",
            "summary.json", ".lock"} <= names
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert rounds == json.loads(json.dumps(hist.rounds))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [2, 3]
    assert [m["task_acc"] for m in metrics] == [e["task_acc"] for e in hist.evaluations]
    # tables report the last scheduled evaluation (paper B.5: round 2 of 3 with eval_every = 2);
    # --statistic final the extra one after the last round
    scheduled, last = hist.evaluations[0], hist.evaluations[-1]
    assert scheduled["round"] == 2 and last["round"] == 3
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for flags, ev in (([], scheduled), (["--statistic", "final"], last)):
        done = subprocess.run([sys.executable, "-m", "fedhv.cli", "table", str(tmp_path / "runs"), "--table", "1",
                               *flags], capture_output=True, text=True, timeout=60, check=False, env=env)
        assert done.returncode == 0, done.stderr
        row = next(line for line in done.stdout.splitlines() if line.startswith("| toy |"))
        assert f"{ev['mean_acc']:.2f}" in row and f"{ev['worst_acc']:.2f}" in row
    done = subprocess.run([sys.executable, "-m", "fedhv.cli", "table", str(out), "--table", "8"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert f"{scheduled['mean_loss']:.4f}" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] == hist.reference and summary["tasks"] == ["cls", "reg"]
    assert summary["calibration"]["bytes_down"] == hist.calibration.bytes_down > 0  # type: ignore[union-attr]
    state = torch.load(out / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(state[k], v) for k, v in hist.model.state_dict().items())


def test_simulate_out_is_exclusive_and_a_failed_start_leaves_nothing(tmp_path: Path) -> None:
    from fedhv.results.rundir import RunDir

    data = _small(tmp_path)
    kw: dict[str, Any] = {"rounds": 1, "clients_per_round": 2, "local_steps": 1, "batch_size": 8}
    bad = tmp_path / "a" / "bad"
    with pytest.raises(FedHVError, match="has 1 values but .* has 2 tasks"):
        fedhv.simulate(_model(), data, fedhv.FedHV(reference=[3.0]), out=bad, **kw)
    assert not (tmp_path / "a").exists()  # the folders the claim created are removed again
    out = tmp_path / "run"
    fedhv.simulate(_model(), data, fedhv.Uniform(), out=out, **kw)
    with pytest.raises(FedHVError, match="already holds a finished run"):
        fedhv.simulate(_model(), data, fedhv.Uniform(), out=out, **kw)
    before = (out / "summary.json").read_text()
    fedhv.simulate(_model(), data, fedhv.Uniform(), out=out, overwrite=True, seed=5, **kw)
    assert json.loads((out / "summary.json").read_text())["seed"] == 5 != json.loads(before)["seed"]
    busy = tmp_path / "busy"
    busy.mkdir()
    holder = RunDir(busy)  # another writer holds the lock
    try:
        with pytest.raises(FedHVError, match="in use by another fedhv process"):
            fedhv.simulate(_model(), data, fedhv.Uniform(), out=busy, **kw)
    finally:
        holder.close()
    assert np.isfinite(json.loads((out / "summary.json").read_text())["mean_loss"])
