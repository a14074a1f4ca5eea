"""FedHV's calibration runs on the partition and seeds of paper B.8 (issue 11, item 1).

CIFAR10-MNIST calibrates on the alpha = 0.30 partition for both settings; CelebA5 takes
the maximum over seeds 0, 42 and 2026 on the first-label alpha = 0.30 partition; the
other presets calibrate on their own partition. The presets must say so, and
:func:`fedhv.experiment.method_setup.resolve_reference` must actually build that partition:
the first report of every calibration seed equals an oracle computed on a partition
built by hand with the expected alpha / strata (the seed's initial model on the sampled
clients' whole local data), and that oracle differs on the run's own partition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from celeba_fixture import make_celeba
from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.data.federated import FederatedData
from fedhv.experiment.method_setup import resolve_reference
from fedhv.experiment.setup import federated_data, new_model, sample_clients
from fedhv.metrics.evaluate import per_sample_losses

from helpers import small_config, small_data

#: Paper B.8 / README: (alpha, strata, seeds, margin) of each preset's calibration partition.
EXPECTED = {
    "multimnist": (0.15, "all-label", (0,), 0.15),
    "mnist-fmnist": (0.30, "all-label", (0,), 0.15),
    "cifar10-mnist-a": (0.30, "all-label", (0,), 0.15),
    "cifar10-mnist-b": (0.30, "all-label", (0,), 0.15),
    "celeba5-a": (0.30, "first-label", (0, 42, 2026), 0.30),
    "celeba5-b": (0.30, "first-label", (0, 42, 2026), 0.30),
}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_presets_calibrate_on_the_paper_partition(preset: str) -> None:
    cfg = load_config(preset)
    alpha, strata, seeds, margin = EXPECTED[preset]
    p = cfg.calibration.partition_for(cfg.partition)
    assert (p.alpha, p.strata) == (alpha, strata)
    assert (p.clients, p.samples_per_client, p.seed) == (30, cfg.partition.samples_per_client, 10)
    assert tuple(cfg.calibration.seeds) == seeds and cfg.calibration.margin == margin
    assert cfg.calibration.rounds == 20


def _on_partition(cfg: RunConfig, alpha: float, strata: str) -> RunConfig:
    """``cfg`` with its run partition replaced by hand (not through ``partition_for``)."""
    return dataclasses.replace(cfg, partition=dataclasses.replace(cfg.partition, alpha=alpha, strata=strata))


def _first_report(cfg: RunConfig, data: FederatedData, seed: int) -> np.ndarray:
    """Oracle of a calibration's first averaged report: the initial model of ``seed`` (eval
    mode) on the whole local data of the clients sampled from the ``"calibration"`` stream.

    ``F_i = mean_{c in S_0} mean_{j in D_c} l_i(theta_0(seed); x_j)`` (paper §3.2, B.8).
    """
    model = new_model(cfg, data, seed).eval()
    clients = sample_clients(seed, "calibration", 0, data.num_clients, cfg.train.clients_per_round)
    per_client = []
    for c in clients:
        idx = data.parts[int(c)]
        losses, _ = per_sample_losses(model, data.train_x[idx], data.train_y[idx], 4096, data.objective)
        per_client.append(losses.double().mean(0))
    return torch.stack(per_client).mean(0).numpy()


def _check_first_reports(reports: dict[str, list[list[float]]], cfg: RunConfig, expected: FederatedData,
                         own: FederatedData) -> None:
    """Each seed's first report matches the oracle on ``expected``, and is far from the one on ``own``."""
    for seed in cfg.calibration.seeds:
        want = _first_report(cfg, expected, seed)
        np.testing.assert_allclose(reports[str(seed)][0], want, rtol=1e-5, atol=0)
        other = _first_report(cfg, own, seed)
        assert np.abs(other - want).max() > 1e-3 * np.abs(want).max()  # the oracle tells partitions apart


@pytest.fixture
def _one_thread() -> Iterator[None]:
    """One torch thread: several times faster for these tiny models on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.needs_data
@pytest.mark.usefixtures("_one_thread")
def test_calibration_uses_the_configured_alpha() -> None:
    """The CIFAR10-MNIST mechanism (alpha only) on MultiMNIST: run alpha 0.15, calibration alpha 0.30."""
    cfg = small_config('method="fedhv"', "calibration.rounds=1", "calibration.partition_alpha=0.30",
                       "partition.samples_per_client=32")
    assert (cfg.partition.alpha, cfg.partition.strata) == (0.15, "all-label")
    run_data = small_data(cfg)
    _, _, result = resolve_reference(cfg, run_data)
    assert result is not None and result.seeds == [0] and set(result.reports) == {"0"}
    _check_first_reports(result.reports, cfg, federated_data(_on_partition(cfg, 0.30, "all-label")), run_data)


@pytest.fixture(scope="module")
def celeba_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("celeba-data")
    make_celeba(root / "celeba", n=160)
    return root


@pytest.mark.usefixtures("_one_thread")
@pytest.mark.filterwarnings("ignore:.*not the full CelebA")
@pytest.mark.filterwarnings("ignore:the partition recycled")
def test_celeba5_a_calibrates_on_first_label_alpha_030_with_three_seeds(celeba_root: Path) -> None:
    """The preset's own seeds (0, 42, 2026) and partition, on a synthetic CelebA-layout folder."""
    cfg = load_config("celeba5-a", [
        "partition.clients=4", "partition.samples_per_client=6", "train.clients_per_round=2",
        "train.batch_size=2", "train.local_steps=1", "calibration.rounds=1", f"data.root='{celeba_root}'",
    ])
    assert (cfg.partition.alpha, cfg.partition.strata) == (0.15, "all-attributes")
    assert tuple(cfg.calibration.seeds) == (0, 42, 2026)
    run_data = federated_data(cfg)
    _, _, result = resolve_reference(cfg, run_data)
    assert result is not None and result.seeds == [0, 42, 2026] and set(result.reports) == {"0", "42", "2026"}
    _check_first_reports(result.reports, cfg, federated_data(_on_partition(cfg, 0.30, "first-label")), run_data)
