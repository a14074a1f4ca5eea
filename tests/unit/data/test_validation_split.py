"""The server-side validation set: no client holds it, runs evaluate it beside the test set, and
choices read it instead of the test set (issue 50, item 1)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from torch import nn

import fedhv
from fedhv.config.loader import load_config
from fedhv.data.configured import load_data
from fedhv.errors import ConfigError
from fedhv.rng import numpy_rng

from conftest import SMALL


def _rows(n: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs whose first column is the row number, so a row's origin can be read back."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.arange(n, dtype=torch.float64)[:, None], torch.randn(n, 3, generator=g,
                                                                              dtype=torch.float64)], 1)
    return x, (x[:, 1] > 0).long()


def _held(data: fedhv.FederatedDataset) -> set[int]:
    return {int(v) for c in range(data.num_clients) for v in data.x[data.parts[c], 0].tolist()}


@pytest.mark.parametrize("partition", ["dirichlet", "dirichlet-disjoint"])
def test_a_fraction_is_carved_before_the_partition(partition: str) -> None:
    x, y = _rows()
    data = fedhv.FederatedDataset.from_tensors(x, y, ["pos"], partition=partition, clients=4, validation=0.25,
                                               seed=3)
    assert data.validation is not None
    val_rows = [int(v) for v in data.validation[0][:, 0].tolist()]
    assert len(val_rows) == 50 and len(set(val_rows)) == 50
    assert set(val_rows).isdisjoint(_held(data))  # no client holds a validation row
    assert set(val_rows).isdisjoint(int(v) for v in data.x[:, 0].tolist())  # nor could one: they left x
    assert torch.equal(data.validation[1], y[val_rows].double()[:, None])
    expected = np.sort(numpy_rng(3, "val-split").permutation(200)[:50])  # the documented stream
    assert val_rows == expected.tolist()


def test_with_index_lists_the_fraction_comes_from_the_rows_no_client_holds() -> None:
    x, y = _rows(100)
    lists = [list(range(30)), list(range(30, 60))]
    data = fedhv.FederatedDataset.from_tensors(x, y, ["pos"], partition=lists, validation=0.2, seed=1)
    assert data.validation is not None
    val_rows = {int(v) for v in data.validation[0][:, 0].tolist()}
    assert len(val_rows) == 20 and val_rows <= set(range(60, 100))
    with pytest.raises(ConfigError, match=r"validation = 0\.5 needs 50 rows but only 40 .* at most 0\.4"):
        fedhv.FederatedDataset.from_tensors(x, y, ["pos"], partition=lists, validation=0.5)


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.1, True, "0.1"])
def test_a_bad_fraction_is_refused_naming_it(bad: object) -> None:
    x, y = _rows()
    with pytest.raises(ConfigError, match=r"validation = .* must be a fraction in \(0, 1\)"):
        fedhv.FederatedDataset.from_tensors(x, y, ["pos"], clients=4, validation=bad)  # type: ignore[arg-type]


def test_a_given_validation_set_is_evaluated_beside_the_test_set() -> None:
    """Given the test tensors as the validation set too, the two evaluations agree to the bit (same
    evaluation, other key); a run without validation evaluates the test set only."""
    x, y = _rows(240)
    test = (x[:60], y[:60])
    tasks = [fedhv.Task("pos", "classification", 2)]
    with_val = fedhv.FederatedDataset.from_tensors(x, y, tasks, clients=4, test=test, validation=test)
    without = fedhv.FederatedDataset.from_tensors(x, y, tasks, clients=4, test=test)
    runs = []
    for data in (with_val, without):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).double()
        runs.append(fedhv.simulate(model, data, fedhv.Uniform(), rounds=2, clients_per_round=2, local_steps=2,
                                   batch_size=8, progress=False))
    for entry in runs[0].evaluations:
        assert entry["val"]["task_acc"] == entry["task_acc"] and entry["val"]["hv"] == entry["hv"]
    assert all("val" not in e for e in runs[1].evaluations)
    assert [e["task_loss"] for e in runs[0].evaluations] == [e["task_loss"] for e in runs[1].evaluations]


def test_naming_a_set_the_data_lacks_is_refused_before_round_1() -> None:
    x, y = _rows(240)
    data = fedhv.FederatedDataset.from_tensors(x, y, [fedhv.Task("pos", "classification", 2)], clients=4,
                                               test=(x[:60], y[:60]))
    from fedhv.experiment.records import evaluated_splits

    cfg = load_config("multimnist", overrides=['eval.splits=["test", "val"]'])
    with pytest.raises(ConfigError, match=r"eval.splits = \['test', 'val'\].*holds no 'val' set.*validation="):
        evaluated_splits(cfg, data.federated(torch.float64, "cpu"))
    assert evaluated_splits(load_config("multimnist"), data.federated(torch.float64, "cpu")) == ("test",)


def _digests(images: np.ndarray) -> set[str]:
    return {hashlib.sha256(row.tobytes()).hexdigest() for row in images}


@pytest.mark.parametrize("setting", ["multimnist", "mnist-fmnist"])
def test_a_benchmark_validation_set_is_disjoint_from_every_client_and_the_test_set(
        setting: str, data_root: object, tmp_path: object) -> None:
    """By content: no validation image is an image a client holds or a test image (the paper's
    partition, 30 clients x 600 samples)."""
    cfg = load_config(setting, overrides=[f"data.root={json.dumps(str(data_root))}"])
    bench, parts = load_data(cfg)
    val = _digests(bench.val_x)
    assert len(bench.val_x) == round(0.2 * (len(bench.train_x) + len(bench.val_x)))
    held = _digests(bench.train_x[np.unique(np.concatenate(list(parts)))])
    assert val.isdisjoint(held)
    assert val.isdisjoint(_digests(bench.test_x))


def test_a_benchmark_run_evaluates_its_validation_set_by_default(data_root: object, tmp_path: object) -> None:
    from fedhv.cli import main

    out = tmp_path / "run"  # type: ignore[operator]
    sets = [a for o in SMALL for a in ("--set", o)]
    assert main(["run", "multimnist", "--method", "uniform", "--rounds", "2", "--out", str(out), "--quiet",
                 "--data-dir", str(data_root), *sets]) == 0
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert entries and all(set(e["val"]) >= {"mean_acc", "worst_acc", "task_acc", "hv"} for e in entries)
    assert all(e["val"]["task_acc"] != e["task_acc"] for e in entries)  # another set than the test set
