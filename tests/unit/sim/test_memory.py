"""``engine_chunk = "auto"``: the batched engine's chunk chosen from available memory (issue 13 item 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import get_flat, native
from fedhv.models.lenet import LeNetMTL
from fedhv.sim.memory import (
    _cgroup_headroom,
    _meminfo_available,
    available_bytes,
    choose_chunk,
    copy_step_bytes,
    saved_activation_bytes,
)

from helpers import small_config, small_data

MIB = 2**20


def test_choose_chunk_golden() -> None:
    """c = max(1, floor(f * A / b)), by hand."""
    assert choose_chunk(100 * MIB, 1024 * MIB).chunk == 5  # 512 / 100 = 5.12
    assert choose_chunk(100 * MIB, 1000 * MIB).chunk == 5  # 500 / 100 exactly
    assert choose_chunk(100 * MIB, 999 * MIB).chunk == 4  # 499.5 / 100
    assert choose_chunk(1131 * MIB, 20 * 1024 * MIB).chunk == 9  # CelebA5 copy on a 20 GiB host: 10240 / 1131
    assert choose_chunk(1131 * MIB, 10 * 1024 * MIB, fraction=0.25).chunk == 2  # 2560 / 1131
    assert choose_chunk(100 * MIB, 150 * MIB).chunk == 1  # not even one fits: still one copy at a time
    assert choose_chunk(100 * MIB, 0).chunk == 1
    with pytest.raises(ValueError, match="copy_bytes = 0"):
        choose_chunk(0, MIB)
    text = choose_chunk(100 * MIB, 1024 * MIB).describe()
    assert "5 model copies at once" in text and "100.0 MiB per copy" in text and "1024 MiB available" in text


def test_available_memory_sources(tmp_path: Path) -> None:
    assert _meminfo_available("MemTotal: 8 kB\nMemFree: 4 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
    assert _meminfo_available("MemTotal: 8 kB\n") is None
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("268435456\n")
    assert _cgroup_headroom(tmp_path) == 768 * MIB
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_headroom(tmp_path) is None
    total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                 if line.startswith("MemTotal:"))
    assert 0 < available_bytes("cpu") <= total


def test_frozen_parameters_are_not_counted_as_copied() -> None:
    """The batched engine copies the trainable parameters only (frozen ones are one shared view), and
    the saved activations of a model with a frozen layer are measured for that model, not taken from
    the cache of the same structure unfrozen: ``d`` in ``b`` is the trainable count."""
    full = LeNetMTL()
    frozen = LeNetMTL()
    for p in list(frozen.parameters())[:2]:  # the first convolution, weight and bias
        p.requires_grad_(False)
    n_frozen = sum(p.numel() for p in frozen.parameters() if not p.requires_grad)
    d = sum(p.numel() for p in frozen.parameters() if p.requires_grad)
    assert 0 < n_frozen and d > 0
    b_full = copy_step_bytes(full, (1, 28, 28), 32, torch.float32)  # measured first: the cache holds it
    b_frozen = copy_step_bytes(frozen, (1, 28, 28), 32, torch.float32)
    a_frozen = saved_activation_bytes(frozen, (1, 28, 28), 32, torch.float32)
    assert b_frozen == 4 * (4 * d + 2 * 32 * 784) + 2 * a_frozen
    assert b_full - b_frozen >= 4 * 4 * n_frozen


def test_copy_step_bytes_by_hand_for_lenet() -> None:
    """b = s (4 d + 2 B x) + 2 a_B; a_B affine in B (measured at B = 2, 3)."""
    model = LeNetMTL()
    d = sum(p.numel() for p in model.parameters())
    assert d == 28_515 + 2 * 3_060
    with native.disabled():  # PyTorch's layers: conv1's full-resolution output is saved
        p1, p2 = (saved_activation_bytes(model, (1, 28, 28), b, torch.float32) for b in (1, 2))
    # Per sample at least the saved conv1 output (10 x 28 x 28 floats) and at most 20 such maps.
    assert 10 * 28 * 28 * 4 <= p2 - p1 <= 20 * 10 * 28 * 28 * 4
    a1, a2, a32 = (saved_activation_bytes(model, (1, 28, 28), b, torch.float32) for b in (1, 2, 32))
    assert a32 == a1 + 31 * (a2 - a1) and a2 > a1 > 0
    if native.available():  # the compiled first layer saves its input and pooled-size codes only
        assert 2 * 10 * 14 * 14 * 4 <= a2 - a1 < 10 * 28 * 28 * 4 < p2 - p1
    assert copy_step_bytes(model, (1, 28, 28), 32, torch.float32) == 4 * (4 * d + 2 * 32 * 784) + 2 * a32
    with native.disabled():  # bf16 runs under autocast, where the compiled kernels step aside
        fp32_pytorch = copy_step_bytes(model, (1, 28, 28), 32, torch.float32)
    assert copy_step_bytes(model, (1, 28, 28), 32, torch.float32, "bf16") == fp32_pytorch + 2 * d


@pytest.mark.needs_data
def test_auto_chunk_equals_explicit_chunk_bit_for_bit() -> None:
    """Memory for three copies' steps: auto picks 3 (of 4 clients) and trains exactly as engine_chunk = 3."""
    cfg = small_config("train.momentum=0.5")
    assert cfg.engine_chunk == "auto"
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    step = copy_step_bytes(model, tuple(data.train_x.shape[1:]), cfg.train.batch_size, torch.float32)
    auto = make_engine(cfg, model, data, 0, "t", available=int(6.5 * step))
    assert auto.chunk == 3 and auto.chunk_choice is not None and auto.chunk_choice.copy_bytes == step
    explicit = make_engine(small_config("train.momentum=0.5", "engine_chunk=3"), new_model(cfg, data, 0), data, 0, "t")
    assert explicit.chunk == 3 and explicit.chunk_choice is None
    theta, clients = get_flat(model).clone(), np.arange(4)
    assert torch.equal(auto.train(theta, clients, np.eye(2), 0), explicit.train(theta, clients, np.eye(2), 0))
    assert torch.equal(auto.gradients(theta, clients, np.eye(2), 0), explicit.gradients(theta, clients, np.eye(2), 0))


@pytest.mark.needs_data
def test_auto_chunk_with_ample_memory_is_all_copies_like_zero() -> None:
    """With the default ("auto") on a machine where every copy fits, a run is the old default (0) bit for bit."""
    cfg = small_config()
    data = small_data(cfg)
    auto = make_engine(cfg, new_model(cfg, data, 0), data, 0, "t")
    assert auto.chunk >= 2 * cfg.train.clients_per_round  # a few MiB per LeNet copy
    zero = make_engine(small_config("engine_chunk=0"), new_model(cfg, data, 0), data, 0, "t")
    assert zero.chunk == 0
    theta, clients, w = get_flat(new_model(cfg, data, 0)), np.arange(4), np.array([[0.4, 0.6]])
    assert torch.equal(auto.train(theta, clients, w, 0), zero.train(theta, clients, w, 0))


@pytest.mark.parametrize("value", ["-1", "'big'", "1.5"])
def test_bad_engine_chunk_is_one_line_error(value: str) -> None:
    with pytest.raises(ConfigError, match="engine_chunk") as info:
        load_config("multimnist", [f"engine_chunk={value}"])
    assert "\n" not in str(info.value)
    assert load_config("multimnist", ["engine_chunk=0"]).engine_chunk == 0
    assert load_config("multimnist", ["engine_chunk='auto'"]).engine_chunk == "auto"


def test_auto_chunk_estimates_a_batchnorm_model(caplog: pytest.LogCaptureFixture) -> None:
    """A model with ``nn.BatchNorm1d`` (no training forward on one row) is measured at batches of 2
    and 3, so ``engine_chunk = "auto"`` estimates it instead of falling back to all copies at once."""
    import logging

    from torch import nn

    import fedhv

    class BNNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())
            self.heads = nn.ModuleList([nn.Linear(6, 2), nn.Linear(6, 1)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            h = self.encoder(x)
            return [head(h) for head in self.heads]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 4, generator=g)
    data = fedhv.FederatedDataset.from_tensors(
        x, [(x[:, 0] > 0).long(), x[:, 1:2]], [fedhv.Task("a"), fedhv.Task("b", "regression", 1)],
        partition=[list(range(k, k + 3)) for k in range(0, 24, 3)])
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        hist = fedhv.simulate(BNNet(), data, fedhv.Uniform(), rounds=1, clients_per_round=8, local_steps=1,
                              batch_size=3, progress=False)
    assert not [r for r in caplog.records if "cannot estimate" in r.getMessage()], caplog.text
    assert hist.rounds and all(torch.isfinite(p).all() for p in hist.model.parameters())
