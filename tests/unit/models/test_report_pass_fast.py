"""The fast report pass and test evaluation (issue 13) keep their meaning.

Objective reports and test evaluation run the built-in CNNs through
:func:`fedhv.models.inference.inference_forward` (oneDNN layout, or LeNet's own forward with
its compiled first layer, float32 on the CPU) and
gather the evaluated rows chunk by chunk (``per_sample_losses(..., rows=)``). Oracles:
the model's own ``forward`` one sample at a time, and the sequential engine's
per-client report loop.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import numpy as np
import pytest
import torch

from fedhv.experiment.setup import new_model
from fedhv.metrics.evaluate import evaluate_tasks, per_sample_losses
from fedhv.models import get_flat, native, set_flat
from fedhv.models.cifar_cnn import CifarCNN
from fedhv.models.inference import CHUNK, NATIVE_CHUNK, inference_forward, plain_forward
from fedhv.models.lenet import LeNetMTL
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import SequentialEngine

from helpers import small_config, small_data

#: Client 2 of a round reports on fewer samples than the others (its first ``SHORT`` rows).
SHORT = 23


def _oracle(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, objective):  # type: ignore[no-untyped-def]
    """Per-sample losses and correctness from ``model(x[r : r + 1])``, one sample at a time."""
    with torch.no_grad():
        parts = [objective.per_sample(model(x[r : r + 1]), y[r : r + 1]) for r in rows.tolist()]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _trained_like(model: torch.nn.Module, seed: int = 3, scale: float = 0.05) -> torch.nn.Module:
    """Perturb the initial parameters so that outputs differ clearly from sample to sample."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model.eval()


@pytest.mark.needs_data
def test_inference_forward_equals_model_forward_float32() -> None:
    """The oneDNN-layout forward of LeNet (real MultiMNIST images) and of the CIFAR CNN
    gives ``model(x)``'s outputs to float32 round-off, sample by sample."""
    cfg = small_config()
    data = small_data(cfg)
    lenet = _trained_like(new_model(cfg, data, 0))
    assert isinstance(lenet, LeNetMTL)
    cifar = _trained_like(CifarCNN().float(), scale=0.01)
    lenet_x = data.eval_sets["test"][0][:300]
    cases = [(lenet, lenet_x, contextlib.nullcontext()), (lenet, lenet_x, native.disabled()),
             (cifar, torch.randn(70, 3, 32, 32, generator=torch.Generator().manual_seed(1)), native.disabled())]
    for model, x, kernel in cases:
        with native.disabled():
            ref_model = copy.deepcopy(model)
        with kernel:  # LeNet: its own forward with the compiled first layer, or the oneDNN path
            fast = inference_forward(model, x)
            assert fast is not None, type(model).__name__
            forward, chunk = fast
            with torch.no_grad():
                got = [torch.cat(parts) for parts in zip(*(forward(x[i : i + chunk])
                                                           for i in range(0, len(x), chunk)))]
        with native.disabled(), torch.no_grad():
            ref = ref_model(x)  # PyTorch's own layers throughout
        for r, o in zip(ref, got):
            assert o.shape == r.shape and o.dtype == torch.float32
            torch.testing.assert_close(o, r, rtol=0, atol=1e-5)
            assert (r[1:] - r[:-1]).abs().amax(1).min() > 1e-3  # rows are distinguishable


def test_inference_forward_only_where_it_applies() -> None:
    """float64, oneDNN disabled (without the compiled kernel), a subclass with its own forward and a
    bf16 wrapper keep ``model(x)``; with the kernel, LeNet's fast forward is its own."""
    from fedhv.sim.precision import amp_module

    model = LeNetMTL().eval()
    x = torch.randn(4, 1, 28, 28)
    assert inference_forward(model, x) == (model, NATIVE_CHUNK)
    with native.disabled():
        fast = inference_forward(model, x)
        assert fast is not None and fast[0] is not model and fast[1] == CHUNK
    assert inference_forward(LeNetMTL().double(), x.double()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about TF32 on Intel GPUs when the flags change
        with torch.backends.mkldnn.flags(enabled=False):
            assert inference_forward(CifarCNN().float(), torch.randn(2, 3, 32, 32)) is None
            with native.disabled():
                assert inference_forward(model, x) is None
    with plain_forward():
        assert inference_forward(model, x) is None
    assert inference_forward(model, x) is not None

    class Custom(LeNetMTL):
        def forward(self, x, masks=None):  # type: ignore[no-untyped-def]
            return super().forward(x * 2, masks)

    assert inference_forward(Custom(), x) is None
    assert inference_forward(amp_module(model, "bf16"), x) is None


@pytest.mark.needs_data
@pytest.mark.parametrize("dtype,atol", [("float64", 1e-12), ("float32", 1e-5)])
def test_per_sample_losses_rows_equal_per_sample_oracle(dtype: str, atol: float) -> None:
    """``rows`` (unsorted, repeated, more than one chunk) evaluates exactly those samples in that order."""
    cfg = small_config(f"dtype='{dtype}'", "partition.samples_per_client=200")  # 1,200 samples > CHUNK + 37
    data = small_data(cfg)
    model = _trained_like(new_model(cfg, data, 0))
    g = torch.Generator().manual_seed(5)
    assert len(data.train_x) > CHUNK + 37
    rows = torch.cat([torch.randperm(len(data.train_x), generator=g)[: CHUNK + 37], torch.tensor([7, 7, 3])])
    losses, correct = per_sample_losses(model, data.train_x, data.train_y, 100, data.objective, rows=rows)
    ref_l, ref_c = _oracle(model, data.train_x, data.train_y, rows, data.objective)
    torch.testing.assert_close(losses, ref_l, rtol=0, atol=atol)
    assert torch.equal(correct, ref_c) or dtype == "float32" and (correct != ref_c).sum() <= 1
    distinct = losses[: CHUNK + 37]
    assert (distinct[:-1] - distinct[1:]).abs().amax(1).min() > 1e-4  # neighbouring rows differ


@pytest.mark.needs_data
@pytest.mark.parametrize("dtype,atol", [("float64", 1e-12), ("float32", 2e-6)])
def test_evaluate_tasks_equals_per_sample_oracle(dtype: str, atol: float) -> None:
    """Test accuracy and mean loss equal the per-sample loop over the whole test set."""
    cfg = small_config(f"dtype='{dtype}'")
    data = small_data(cfg)
    model = _trained_like(new_model(cfg, data, 0))
    x, y = (t[:300] for t in data.eval_sets["test"])
    acc, loss = evaluate_tasks(model, x, y, 128, data.objective)
    ref_l, ref_c = _oracle(model, x, y, torch.arange(len(x)), data.objective)
    np.testing.assert_allclose(loss, ref_l.double().mean(0).numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(acc, (ref_c.double().mean(0) * 100).numpy(), rtol=0, atol=100.0 / len(x) + 1e-9)


class _ShortSeq(SequentialEngine):
    """Client 2 reports on its first ``SHORT`` samples only."""

    def report_indices(self, client: int, round_idx: int, budget: int | str) -> torch.Tensor:
        idx = super().report_indices(client, round_idx, budget)
        return idx[:SHORT] if client == 2 else idx


class _ShortBat(BatchedEngine):
    def report_indices(self, client: int, round_idx: int, budget: int | str) -> torch.Tensor:
        idx = super().report_indices(client, round_idx, budget)
        return idx[:SHORT] if client == 2 else idx


@pytest.mark.needs_data
@pytest.mark.parametrize("dtype,atol", [("float64", 1e-12), ("float32", 2e-6)])
def test_batched_reports_equal_per_client_reference(dtype: str, atol: float) -> None:
    """The one-pass report of the batched engine equals the sequential engine's per-client
    passes and each client's own per-sample mean, with one client holding fewer samples
    (a client's rows mixed with a neighbour's, or offsets shifted, would fail)."""
    cfg = small_config(f"dtype='{dtype}'")
    data = small_data(cfg)
    seq = _ShortSeq(new_model(cfg, data, 0), data, 3, 16, 0.1, 0.0, 0, "t")
    # 41-sample chunks: client boundaries fall inside chunks.
    bat = _ShortBat(new_model(cfg, data, 0), data, 3, 16, 0.1, 0.0, 0, "t", eval_batch_size=41)
    theta = get_flat(_trained_like(new_model(cfg, data, 0))).clone()
    clients = np.array([4, 2, 0, 5])
    for budget in ("all", 3):
        got = bat.reports(theta, clients, 1, budget)
        torch.testing.assert_close(got, seq.reports(theta, clients, 1, budget), rtol=0, atol=atol)
        probe = new_model(cfg, data, 1).eval()
        set_flat(probe, theta)
        means = torch.stack([_oracle(probe, data.train_x, data.train_y, seq.report_indices(int(c), 1, budget),
                                     data.objective)[0].mean(0) for c in clients])
        torch.testing.assert_close(got, means, rtol=0, atol=atol)
        assert (means[:, None] - means[None]).abs().amax(-1).add(torch.eye(len(clients), dtype=means.dtype)).min() > 1e-4


@pytest.mark.needs_data
@pytest.mark.parametrize("compiled", [True, False])
def test_report_pass_gathers_chunks_in_fast_layout(compiled: bool) -> None:
    """The float32 report pass gathers one chunk of samples at a time (``min(eval_batch_size,
    CHUNK)``), never all report samples at once, and runs LeNet's compiled first layer once per
    chunk, or (kernel disabled) the encoder in oneDNN's layout."""
    from torch.profiler import ProfilerActivity, profile

    cfg = small_config()
    data = small_data(cfg)
    engine = BatchedEngine(new_model(cfg, data, 0), data, 3, 16, 0.1, 0.0, 0, "t", eval_batch_size=100)
    theta = get_flat(new_model(cfg, data, 0)).clone()
    clients = np.arange(data.num_clients)
    calls = native.CALLS["forward"]
    kernel = contextlib.nullcontext() if compiled else native.disabled()
    with kernel, profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.reports(theta, clients, 0, "all")
    events = prof.key_averages(group_by_input_shape=True)
    names = {e.key for e in events}
    n = int(data.parts[clients].numel())
    assert n > 300 and CHUNK > 100 and NATIVE_CHUNK > 100
    image_gathers = sum(e.count for e in events if e.key == "aten::index" and len(e.input_shapes[0]) == 4)
    assert image_gathers == -(-n // 100)  # one gather per chunk
    if compiled:
        assert native.CALLS["forward"] - calls == -(-n // 100) and "aten::to_mkldnn" not in names
        return
    assert "aten::to_mkldnn" in names and "aten::mkldnn_convolution" in names
    assert native.CALLS["forward"] == calls
    converted = [e.input_shapes[0][0] for e in events if e.key == "aten::to_mkldnn" for _ in range(e.count)]
    assert sum(converted) == n and max(converted) == 100
