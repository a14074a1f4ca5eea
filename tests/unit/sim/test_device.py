"""The device path: engines keep every tensor on the run's device, ``device`` is validated,
and a run resumes on another device.

There is no GPU here: the engines run on the ``meta`` device (tensors with shapes and a
device but no values), where mixing in a CPU tensor raises exactly as it does on CUDA
(``Tensor on device cpu is not on the expected device meta!``). So any plan, weight or
sketch tensor left on the CPU fails these tests. Some meta kernels (matrix products)
do not check devices, so :class:`SameDevice` also checks every torch call's tensor
arguments, with CUDA's rules. ``perf/device_check.py`` checks the values on a
real GPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from fedhv.config.loader import config_from_toml_text
from fedhv.data.augment import Augment
from fedhv.data.federated import FederatedData
from fedhv.errors import ConfigError
from fedhv.experiment import run_experiment
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import CifarCNN, MultiTaskModel, ResNet18GN, get_flat
from fedhv.objectives import MultiLabel
from fedhv.rng import torch_generator
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import Engine, SequentialEngine
from fedhv.weighting.randsvd import compress

from helpers import cli, small_config, small_data

META = torch.device("meta")


class SameDevice(TorchFunctionMode):
    """Fail any torch call whose tensor arguments live on different devices.

    CUDA's exceptions are allowed: 0-dim CPU tensors (scalars) and CPU index tensors
    in ``tensor[index]``.
    """

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            devices = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() > 0}
            assert len(devices) <= 1, f"{getattr(func, '__name__', func)} mixes devices {sorted(map(str, devices))}"
        return func(*args, **kwargs)


def _on_meta(data: FederatedData) -> FederatedData:
    def to(t: torch.Tensor) -> torch.Tensor:
        return t.to(META)

    return dataclasses.replace(data, train_x=to(data.train_x), train_y=to(data.train_y), parts=to(data.parts),
                               eval_sets={k: (to(x), to(y)) for k, (x, y) in data.eval_sets.items()})


def _exercise(engine: Engine, theta: torch.Tensor, m: int) -> None:
    """Every engine primitive: reports (whole data and minibatch budget), per-task
    gradients, multi-row training and FedCMOO's given first step."""
    clients = np.array([0, 2, 3])
    d = theta.numel()
    with SameDevice():
        _primitives(engine, theta, m, clients, d)


def _primitives(engine: Engine, theta: torch.Tensor, m: int, clients: np.ndarray, d: int) -> None:
    for budget in ("all", 1):
        reports = engine.reports(theta, clients, 0, budget)
        assert reports.device == META and reports.shape == (3, m)
    grads = engine.gradients(theta, clients, np.eye(m), 1)
    assert grads.device == META and grads.shape == (3, m, d)
    deltas = engine.train(theta, clients, np.full((1, m), 1.0 / m), 1)
    assert deltas.device == META and deltas.shape == (3, 1, d)
    deltas = engine.train(theta, clients, np.eye(m), 2, first_step=grads)
    assert deltas.device == META and deltas.shape == (3, m, d)
    assert engine.as_tensor(np.ones(m)).device == META


@pytest.mark.needs_data
@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_lenet_engines_keep_every_tensor_on_the_device(engine: str) -> None:
    """MultiMNIST (real data moved to meta): rotation, dropout masks, momentum."""
    cfg = small_config(f'engine="{engine}"', "train.momentum=0.5", "train.local_steps=2")
    data = _on_meta(small_data(cfg))
    model = new_model(cfg, data, 0).to(META)
    _exercise(make_engine(cfg, model, data, 0, "train"), get_flat(model), 2)


def _synthetic(shape: tuple[int, ...], labels: int, **kwargs: object) -> FederatedData:
    n, clients = 64, 4
    return FederatedData(
        ("a", "b"), (8, 8), torch.empty(n, *shape, device=META), torch.empty(n, labels, dtype=torch.long, device=META),
        torch.empty(clients, n // clients, dtype=torch.long, device=META), {}, **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("engine", [BatchedEngine, SequentialEngine])
@pytest.mark.parametrize("which", ["cifar-cnn", "resnet18"])
def test_cifar_and_resnet_engines_keep_every_tensor_on_the_device(engine: type[Engine], which: str) -> None:
    """The CIFAR CNN with integer rotations (nearest) and whole-batch flips, and the
    ResNet-18 (the batched engine's folded ``forward_batched``) with multi-label losses, at full size."""
    model: MultiTaskModel
    if which == "cifar-cnn":
        model = CifarCNN((8, 8))
        data = _synthetic((3, 32, 32), 2, augment=Augment(30.0, True, "nearest", 1.0))
    else:
        model = ResNet18GN((8, 8))
        data = _synthetic((3, 32, 32), 16, augment=None, objective=MultiLabel((tuple(range(8)), tuple(range(8, 16)))))
    model = model.to(META)
    eng = engine(model, data, local_steps=2, batch_size=4, lr_local=0.1, momentum=0.9, seed=0)
    _exercise(eng, get_flat(model), 2)


def test_randsvd_sketch_follows_the_gradients_device() -> None:
    """FedCMOO's Gaussian test matrix is drawn on the CPU and moved to the gradients' device."""
    g = torch.empty(1000, 2, device=META)
    with SameDevice():
        c, (left, right) = compress(g, 5, torch_generator(0, "randsvd"))
    assert c.device == left.device == right.device == META and c.shape == (1000, 2)


@pytest.mark.needs_data
def test_engine_rejects_data_on_another_device() -> None:
    cfg = small_config()
    data = small_data(cfg)
    with pytest.raises(ValueError, match="the data is on cpu but the model on meta"):
        make_engine(cfg, new_model(cfg, data, 0).to(META), data, 0, "train")


def _cuda_index_missing(index: int) -> bool:
    return torch.cuda.device_count() <= index


@pytest.mark.parametrize(
    ("device", "reported"),
    [
        ("tpu", "Expected one of cpu, cuda"),
        ("cuda:x", "Invalid device string"),
        ("meta", "which fedhv does not run on"),
        pytest.param("cuda:7", "cuda", marks=pytest.mark.skipif(not _cuda_index_missing(7), reason="has cuda:7")),
    ],
)
def test_load_config_rejects_unknown_or_unavailable_devices(device: str, reported: str) -> None:
    with pytest.raises(ConfigError) as info:
        small_config(f'device="{device}"')
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"device = {device!r} ") and reported in message
    if device == "cuda:7":  # what torch reports: no CUDA at all, or too few devices
        assert "torch.cuda.is_available() = False" in message or "CUDA device(s)" in message


@pytest.mark.parametrize("device", ["tpu", "cuda:7"])
def test_show_config_rejects_devices_with_one_line(device: str) -> None:
    if device == "cuda:7" and not _cuda_index_missing(7):
        pytest.skip("this machine has a cuda:7")
    proc = cli("show-config", "multimnist", "--set", f"device={device}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: device = '{device}' "), proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_runs_config_loads_on_a_cpu_machine_with_a_device_override() -> None:
    """A run directory written on a GPU (``device = "cuda"``) is read back for resuming on
    a CPU-only machine when the device is overridden, and refused with the reason if not."""
    text = 'setting = "multimnist"\ndevice = "cuda"\n[train]\nlr_global = 1.0\nlr_local = 0.1\n'
    with pytest.raises(ConfigError, match="device = 'cuda' is not available"):
        config_from_toml_text(text)
    assert config_from_toml_text(text, device="cpu").device == "cpu"


class _Stop(Exception):
    pass


@pytest.mark.needs_data
def test_resume_continues_on_the_given_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedhv run --resume DIR --device D`` (a real process) continues on D: an unavailable
    D is refused with one line, leaving the run resumable; ``resumes.jsonl`` records D."""
    from fedhv.experiment import loop

    original = loop.SimFederation.exchange

    def failing_exchange(self, theta, request):  # type: ignore[no-untyped-def]
        if self.engine.stream == "train" and self.round_idx == 2:
            raise _Stop
        return original(self, theta, request)

    monkeypatch.setattr(loop.SimFederation, "exchange", failing_exchange)
    run = tmp_path / "run"
    with pytest.raises(_Stop):
        run_experiment(small_config('method="uniform"', "rounds=3"), run, progress=False)
    monkeypatch.setattr(loop.SimFederation, "exchange", original)
    assert (run / "checkpoint.pt").exists()

    def resume(device: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fedhv.cli", "run", "--resume", str(run), "--device", device,
                               "--quiet"], capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ))

    if _cuda_index_missing(7):
        bad = resume("cuda:7")
        assert bad.returncode == 2 and bad.stderr.strip().startswith("error: device = 'cuda:7' is not available")
        assert len(bad.stderr.strip().splitlines()) == 1 and (run / "checkpoint.pt").exists()
    ok = resume("cpu")
    assert ok.returncode == 0, ok.stderr
    assert (run / "summary.json").exists()
    resumes = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert resumes[-1]["device"] == "cpu" and resumes[-1]["round"] == 2
