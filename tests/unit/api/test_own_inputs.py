"""A user's own data (issue 27): checks before round 1, small and empty clients, model.pt, API.

Each test fails on the code before issue 27 (bad labels, head widths, NaNs and uint8 ran or
failed mid-run; a client smaller than the batch crashed when first sampled; empty clients
were refused; ``model.pt`` of a CLI user benchmark had ``module.``-prefixed keys).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import nn

import fedhv
from fedhv.sim.plan import epoch_batches


class MLP(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (3, 1), squeeze: bool = False) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(8, w) for w in widths])
        self.squeeze = squeeze

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = self.encoder(x)
        out = [head(h) for head in self.heads]
        return [out[0], out[1].squeeze(-1)] if self.squeeze else out


TASKS = [fedhv.Task("cls", size=3), fedhv.Task("reg", "regression", 1)]


def _xy(n: int = 120) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long(), x[:, 2:3].clone()


def _sim(data: fedhv.FederatedDataset, model: nn.Module | None = None, **kw):
    opts = {"rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 8, "lr_local": 0.05, "progress": False}
    opts.update(kw)
    return fedhv.simulate(model or MLP(), data, fedhv.Uniform(), **opts)


@pytest.mark.parametrize(("label", "match"), [
    (3, r"task 'cls' has label 3 \(row 5\) outside \[0, 3\)"),
    (-1, r"task 'cls' has label -1 \(row 5\) outside \[0, 3\)"),
    (1.5, r"task 'cls' has a fractional class label 1.5 \(row 5\)"),
])
def test_bad_class_labels_are_refused_naming_task_and_row(label: float, match: str) -> None:
    x, y, v = _xy()
    y = y.double()
    y[5] = label
    with pytest.raises(fedhv.ConfigError, match=match):
        fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4)


def test_targets_of_another_length_nan_and_uint8_are_refused() -> None:
    x, y, v = _xy()
    with pytest.raises(fedhv.ConfigError, match="task 'reg' has 119 targets for 120 inputs"):
        fedhv.FederatedDataset.from_tensors(x, [y, v[:-1]], TASKS, clients=4)
    bad = v.clone()
    bad[7] = math.nan
    with pytest.raises(fedhv.ConfigError, match=r"task 'reg' has NaN or infinite targets \(first in row 7\)"):
        fedhv.FederatedDataset.from_tensors(x, [y, bad], TASKS, clients=4)
    xb = x.clone()
    xb[9, 2] = math.inf
    with pytest.raises(fedhv.ConfigError, match=r"x has NaN or infinite values \(first in row 9\)"):
        fedhv.FederatedDataset.from_tensors(xb, [y, v], TASKS, clients=4)
    with pytest.raises(fedhv.ConfigError, match=r"x has dtype uint8.*x.float\(\) / 255"):
        fedhv.FederatedDataset.from_tensors((x.abs() * 50).to(torch.uint8), [y, v], TASKS, clients=4)
    with pytest.raises(fedhv.ConfigError, match="multilabel target outside"):
        fedhv.FederatedDataset.from_tensors(x, [y, v + 5], [TASKS[0], fedhv.Task("m", "multilabel", 1)], clients=4)


def test_float64_inputs_are_cast_to_the_models_dtype() -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x.double(), [y, v], TASKS, clients=4)
    assert _sim(data).rounds  # a float32 model on float64 data: cast, as documented


@pytest.mark.parametrize(("model", "match"), [
    (MLP((2, 1)), r"task 'cls': the model's output has shape \[8, 2\] for 8 rows; expected \[8, 3\]"),
    (MLP((4, 1)), r"task 'cls': the model's output has shape \[8, 4\] for 8 rows; expected \[8, 3\]"),
    (MLP((3, 1), squeeze=True), r"task 'reg': the model's output has shape \[8\] for 8 rows; expected \[8, 1\]"),
])
def test_head_widths_that_differ_from_task_size_are_refused_before_round_one(model: nn.Module, match: str) -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4)
    with pytest.raises(fedhv.ConfigError, match=match):
        _sim(data, model)


def test_a_model_that_fails_on_the_inputs_is_one_line_error() -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4)

    class Wrong(MLP):
        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return super().forward(x[:, :3])

    with pytest.raises(fedhv.ConfigError, match=r"the model fails on 2 rows of x \(shape \[2, 4\]"):
        _sim(data, Wrong())


def test_nan_loss_into_hv_weighting_is_refused_naming_the_task() -> None:
    hv = fedhv.HVWeighting([3.0, 3.0, 3.0])
    with pytest.raises(fedhv.ConfigError, match=r"losses\[\.\.\., 1\] is not finite"):
        hv(torch.tensor([1.0, math.nan, 2.0]))


def test_small_client_batches_repeat_its_samples_evenly() -> None:
    local = torch.arange(100, 105)  # 5 samples, batch 16: no full batch
    g = torch.Generator().manual_seed(0)
    batches = epoch_batches(local, 3, 16, g)
    assert batches.shape == (3, 16)
    stream = batches.reshape(-1).tolist()
    for start in range(0, 45, 5):  # consecutive blocks of 5 are permutations of the client's samples
        assert sorted(stream[start : start + 5]) == list(range(100, 105))
    counts = Counter(stream)  # over the round's 48 draws: floor(48/5) = 9 or ceil = 10 times each
    assert set(counts) == set(range(100, 105)) and set(counts.values()) <= {9, 10}


def test_small_and_empty_clients_train_on_both_engines_identically_and_empty_is_never_sampled() -> None:
    x, y, v = _xy(200)
    parts = [list(range(5)), list(range(5, 8)), [], list(range(8, 60)), list(range(60, 160))]
    data = fedhv.FederatedDataset.from_tensors(x.double(), [y, v], TASKS, partition=parts,
                                               test=(x[160:].double(), [y[160:], v[160:]]))
    assert data.client_sizes == [5, 3, 0, 52, 100]
    runs = []
    for engine in ("batched", "sequential"):
        torch.manual_seed(1)
        hist = _sim(data, MLP().double(), rounds=8, clients_per_round=4, engine=engine, batch_size=16)
        assert all(2 not in r["clients"] for r in hist.rounds)
        assert {c for r in hist.rounds for c in r["clients"]} == {0, 1, 3, 4}
        runs.append(hist)
    for (name, a), (_, b) in zip(runs[0].model.state_dict().items(), runs[1].model.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)
    with pytest.raises(fedhv.ConfigError, match=r"clients_per_round = 5 must be in \[1, 4\].*1 of the 5 clients are empty"):
        _sim(data, MLP().double(), clients_per_round=5)


def test_model_pt_loads_into_the_users_module_and_overwrite_replaces_an_unfinished_run(tmp_path) -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4, test=(x[:40], [y[:40], v[:40]]))
    model = nn.Sequential()  # a model whose state_dict keys would carry any prefix fedhv added
    hist = _sim(data, out=tmp_path / "run")
    loaded = MLP()
    loaded.load_state_dict(torch.load(tmp_path / "run" / "model.pt", weights_only=True)["state_dict"])
    for a, b in zip(loaded.state_dict().values(), hist.model.state_dict().values()):
        assert torch.equal(a, b)
    del model
    # an unfinished simulate run (no summary.json): refused without overwrite, replaced with it
    (tmp_path / "run" / "summary.json").unlink()
    with pytest.raises(fedhv.RunDirError, match="unfinished fedhv.simulate run.*overwrite=True"):
        _sim(data, out=tmp_path / "run")
    assert _sim(data, out=tmp_path / "run", overwrite=True).out == tmp_path / "run"


def test_callback_stops_the_run_and_rows_are_flat() -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4, test=(x[:40], [y[:40], v[:40]]))
    seen: list[int] = []

    def stop_at_two(rnd: int, record: dict) -> bool:
        seen.append(rnd)
        assert "evaluation" in record and record["evaluation"]["round"] == rnd
        return rnd == 2

    hist = _sim(data, rounds=5, callback=stop_at_two)
    assert seen == [1, 2] and len(hist.rounds) == 2 and hist.stopped_early
    rows = hist.to_rows()
    assert [r["round"] for r in rows] == [1, 2]
    assert {"weight/cls", "weight/reg", "acc/cls", "score/reg", "loss/reg", "mean_acc"} <= set(rows[-1])
    assert "acc/reg" not in rows[-1]
    assert rows[-1]["acc/cls"] == hist.evaluations[-1]["task_acc"][0]


def test_device_argument_and_public_errors() -> None:
    x, y, v = _xy()
    data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=4)
    torch.manual_seed(0)
    a = _sim(data, MLP(), device="cpu")
    torch.manual_seed(0)
    b = _sim(data, MLP())
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    with pytest.raises(fedhv.ConfigError, match="device = 'gpu0' is not a torch device"):
        _sim(data, device="gpu0")
    assert issubclass(fedhv.ConfigError, fedhv.FedHVError) and issubclass(fedhv.DatasetTooLarge, fedhv.FedHVError)


def test_recycling_warning_names_the_dry_strata_and_disjoint_partition_shares_nothing() -> None:
    x, y, v = _xy(400)
    with pytest.warns(UserWarning) as caught:
        data = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, clients=8, alpha=0.3)  # N * S = n
    text = str(caught[0].message)
    shared = sum(len(data.parts[c]) for c in range(8)) - len(torch.unique(data.parts.reshape(-1)))
    assert "ran dry" in text and f"{shared} of the 400 client slots" in text and "exceeds" not in text
    assert shared > 0
    disjoint = fedhv.FederatedDataset.from_tensors(x, [y, v], TASKS, partition="dirichlet-disjoint", clients=8,
                                                   alpha=0.3)
    rows = [disjoint.parts[c].tolist() for c in range(8)]
    flat = sorted(i for r in rows for i in r)
    assert flat == list(range(400))  # every sample exactly once
    assert len({len(r) for r in rows}) > 1  # sizes follow the draws


class BNMLP(MLP):
    """MLP with BatchNorm: its statistics must survive the checkpoint too."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())


@pytest.mark.parametrize("net", [MLP, BNMLP])
def test_a_python_run_interrupted_mid_run_resumes_from_python_to_the_same_model(tmp_path, net) -> None:
    x, y, v = _xy(160)
    data = fedhv.FederatedDataset.from_tensors(x.double(), [y, v], TASKS, clients=5, alpha=1.0,
                                               test=(x[:40].double(), [y[:40], v[:40]]))
    kw = {"rounds": 6, "clients_per_round": 3, "local_steps": 2, "batch_size": 8, "lr_local": 0.05, "eval_every": 2,
          "progress": False}
    torch.manual_seed(0)
    model = net().double()
    whole = fedhv.simulate(model, data, fedhv.FedHV(calibration_rounds=2), out=tmp_path / "whole", **kw)

    def crash(rnd: int, record: dict) -> None:
        if rnd == 3:
            raise KeyboardInterrupt  # a crash after round 3 (round 2's evaluation was checkpointed)

    with pytest.raises(KeyboardInterrupt):
        fedhv.simulate(model, data, fedhv.FedHV(calibration_rounds=2), out=tmp_path / "cut", callback=crash, **kw)
    assert not (tmp_path / "cut" / "summary.json").exists() and (tmp_path / "cut" / "checkpoint.pt").exists()
    with pytest.raises(fedhv.ConfigError, match=r"differ from the run's config.toml in \['rounds'\]"):
        fedhv.simulate(model, data, fedhv.FedHV(calibration_rounds=2), resume=tmp_path / "cut",
                       **{**kw, "rounds": 7})
    other = fedhv.FederatedDataset.from_tensors(x.double() + 1, [y, v], TASKS, clients=5, alpha=1.0,
                                                test=(x[:40].double(), [y[:40], v[:40]]))
    with pytest.raises(fedhv.ConfigError, match="the data differs from the run's"):
        fedhv.simulate(model, other, fedhv.FedHV(calibration_rounds=2), resume=tmp_path / "cut", **kw)
    done = fedhv.simulate(model, data, fedhv.FedHV(calibration_rounds=2), resume=tmp_path / "cut", **kw)
    assert [r["round"] for r in done.rounds] == list(range(1, 7))
    for a, b in zip(done.model.state_dict().values(), whole.model.state_dict().values()):
        assert torch.equal(a, b)
    assert done.evaluations == [{**e, **{k: d[k] for k in e if k.startswith(("time_", "wall"))}}
                                for e, d in zip(whole.evaluations, done.evaluations)]
