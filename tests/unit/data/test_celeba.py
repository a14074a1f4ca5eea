"""CelebA reader, CelebA5 benchmark and end-to-end runs on synthetic CelebA-layout folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from celeba_fixture import make_celeba
from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.data.benchmarks import load_benchmark
from fedhv.data.celeba import GROUPS, load_celeba
from fedhv.errors import DataError
from fedhv.experiment import run_experiment
from fedhv.experiment.setup import federated_data
from fedhv.models import ResNet18GN
from fedhv.objectives import MultiLabel


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("celeba-data")
    make_celeba(root / "celeba", n=160)
    return root


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
@pytest.mark.parametrize("csv", [False, True])
def test_reader_layouts_order_and_resize(tmp_path: Path, csv: bool) -> None:
    attrs, splits = make_celeba(tmp_path, n=40, csv=csv)
    data = load_celeba(tmp_path)
    train_x, train_y = data["train"]
    train_idx = np.flatnonzero(splits == 0)  # names are sorted = index order
    assert train_x.shape == (len(train_idx), 32, 32, 3) and np.array_equal(train_y, attrs[train_idx])
    assert len(data["val"][0]) == int(np.sum(splits == 1)) and len(data["test"][0]) == int(np.sum(splits == 2))
    with Image.open(tmp_path / "img_align_celeba" / f"{train_idx[0] + 1:06d}.jpg") as img:
        expected = np.asarray(img.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    assert np.array_equal(train_x[0], expected)


def test_missing_celeba_is_explained(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot be redistributed"):
        load_celeba(tmp_path)


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
def test_celeba5_benchmark_tasks_and_strata(celeba_root: Path) -> None:
    bench = load_benchmark("celeba5", root=str(celeba_root))
    assert isinstance(bench.objective, MultiLabel) and bench.objective.groups == GROUPS
    assert sorted(a for g in GROUPS for a in g) == list(range(40))
    first = bench.strata("first-label")
    assert first.max() < 8 and len(np.unique(first)) > 4
    code = bench.train_y[:, 2] * 4 + bench.train_y[:, 20] * 2 + bench.train_y[:, 21]
    assert np.array_equal(first, code)
    reps = bench.representative_attributes()
    assert all(r in g for r, g in zip(reps, GROUPS))
    assert bench.strata("all-label").max() < 32


def test_multilabel_objective_matches_bce_and_threshold_accuracy() -> None:
    obj = MultiLabel(((0, 1), (2,)))
    p = [torch.tensor([[0.9, 0.2], [0.4, 0.6]], dtype=torch.float64), torch.tensor([[0.7], [0.1]], dtype=torch.float64)]
    y = torch.tensor([[1, 0, 0], [1, 1, 0]])
    losses, correct = obj.per_sample(p, y)
    bce = lambda q, t: -(t * np.log(q) + (1 - t) * np.log(1 - q))
    np.testing.assert_allclose(losses[0].numpy(), [(bce(0.9, 1) + bce(0.2, 0)) / 2, bce(0.7, 0)])
    np.testing.assert_allclose(correct.numpy(), [[1.0, 0.0], [0.5, 1.0]])
    np.testing.assert_allclose(obj.batch_losses(p, y).numpy(), losses.mean(0).numpy())


def test_resnet18_gn_matches_reference_sizes() -> None:
    m = ResNet18GN()
    enc = sum(p.numel() for n, p in m.named_parameters() if not n.startswith("heads."))
    assert enc == 11_168_832 and sum(p.numel() for p in m.heads[0].parameters()) == 4_104
    assert not any(isinstance(mod, torch.nn.BatchNorm2d) for mod in m.modules())


TINY = ["partition.clients=4", "partition.samples_per_client=20", "train.clients_per_round=2",
        "train.batch_size=8", "train.local_steps=2", "calibration.rounds=1", "calibration.seeds=[0, 42]",
        "eval.test_period=1", "eval.batch_size=64"]


@pytest.mark.deploy
@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
@pytest.mark.filterwarnings("ignore:the partition recycled")
@pytest.mark.parametrize("setting", ["celeba5-a", "celeba5-b"])
def test_celeba5_runs_end_to_end(celeba_root: Path, tmp_path: Path, setting: str) -> None:
    cfg = load_config(setting, [*TINY, f"data.root='{celeba_root}'", "rounds=2"])
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    _check_final_metrics(cfg, tmp_path / "run", summary)
    cal = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert set(cal["reports"]) == {"0", "42"} and cal["margin"] == 0.30
    assert len(summary["reference"]) == 5
    np.testing.assert_allclose(summary["reference"], np.max([r for rows in cal["reports"].values() for r in rows], 0) + 0.3)


def _check_final_metrics(cfg: RunConfig, run: Path, summary: dict) -> None:
    """The summary's metrics equal an independent evaluation of the saved model.

    Task ``i``'s accuracy is the fraction of its 8 attributes (``GROUPS[i]``) predicted
    right at 0.5, in %, over the test set; its loss the mean BCE over the group; WorstAcc
    is the minimum, HV = prod(3 - loss_i) (paper C.1).
    """
    x, y = federated_data(cfg).eval_sets["test"]
    model = ResNet18GN()
    model.load_state_dict(torch.load(run / "model.pt")["state_dict"])
    with torch.no_grad():
        probs = [p.double().numpy() for p in model.eval()(x)]
    labels = y.numpy().astype(np.float64)
    acc = [100.0 * float(np.mean((p > 0.5) == (labels[:, list(g)] > 0.5))) for p, g in zip(probs, GROUPS)]
    loss = [float(np.mean(-(labels[:, list(g)] * np.log(p) + (1 - labels[:, list(g)]) * np.log(1 - p))))
            for p, g in zip(probs, GROUPS)]
    np.testing.assert_allclose(summary["task_acc"], acc, rtol=0, atol=1e-9)
    np.testing.assert_allclose(summary["task_loss"], loss, rtol=1e-5)
    assert summary["mean_acc"] == pytest.approx(np.mean(acc)) and summary["worst_acc"] == pytest.approx(min(acc))
    assert summary["hv"] == pytest.approx(np.prod([3.0 - v for v in loss]), rel=1e-5)


@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
@pytest.mark.filterwarnings("ignore:the partition recycled")
def test_partition_stats_for_celeba(celeba_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedhv.stats import print_partition_stats

    print_partition_stats(load_config("celeba5-b", [*TINY, f"data.root='{celeba_root}'"]))
    out = capsys.readouterr().out
    assert "first-label strata" in out and "strata sizes:" in out and "positive-attribute rate" in out
    assert len([ln for ln in out.splitlines() if ln.strip()[:1].isdigit() and "." in ln]) == 4
