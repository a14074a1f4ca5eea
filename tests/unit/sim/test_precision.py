"""``precision = "bf16"``: bfloat16 autocast forwards, float32 everything else (issue 13 item 4).

Tolerances. bfloat16 keeps 8 significant bits: unit roundoff ``u = 2^-8``. Under CPU
autocast every convolution / matrix product rounds its input and its weights to bf16 and
its output is bf16 (accumulation in fp32), and ``log_softmax`` runs in bf16.

- A loss (a report, a test loss) is a mean of per-sample ``-log p``; rounding the bf16
  ``log p`` alone moves it by at most ``u |log p|``, and the logits' own error (below) by
  at most as much again at the losses here (~2.3, logits near 0 at initialisation), so
  ``|F_bf16 - F_fp32| <= 2 u max|F|`` (~0.018; measured ~0.002).
- A gradient: the forward's relative error is at most ``2 L u`` to first order (inputs and
  weights rounded in each of the ``L = 5`` weight layers of the LeNet) and the backward,
  also in bf16, adds as much: ``||g_bf16 - g_fp32|| <= 4 L u ||g_fp32||`` (~0.078;
  measured 0.036).
- A round's update: K = 3 SGD steps at lr 0.3 through ReLU / max-pool let a rounding
  difference switch which unit is routed, so no roundoff bound holds for theta. The
  meaningful requirement is that bf16 moves the update less than the training's own noise:
  the fp32 update with other minibatches and dropout masks for the same clients (another
  engine stream) differs by ``||Δ' - Δ||``; we require ``||Δ_bf16 - Δ_fp32|| <= ½ ||Δ' - Δ||``
  (measured 0.054 against 0.31/2).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhv.config import load_config
from fedhv.errors import ConfigError
from fedhv.experiment.loop import run_rounds
from fedhv.experiment.method_setup import build_method
from fedhv.experiment.runner import evaluate, run_experiment
from fedhv.experiment.setup import make_engine, new_model
from fedhv.models import get_flat

from conftest import SMALL
from helpers import small_config, small_data

U_BF16 = 2.0**-8
LENET_WEIGHT_LAYERS = 5


def _round_update(*overrides: str, stream: str = "train", engine: str = "batched",
                  rounds: int = 1) -> tuple[torch.Tensor, list[dict]]:
    cfg = small_config("fedhv.reference='paper'", f"engine='{engine}'", *overrides)
    data = small_data(cfg)
    model = new_model(cfg, data, 0)
    theta0 = get_flat(model).clone()
    logs: list[dict] = []
    theta, _ = run_rounds(build_method(cfg, data).algorithm, make_engine(cfg, model, data, 0, stream), data,
                          theta0.clone(), rounds, cfg.train.clients_per_round, 0, "train",
                          lambda rec, th, st: logs.append(rec.log))
    return theta - theta0, logs


@pytest.mark.needs_data
@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_bf16_round_differs_from_fp32_within_training_noise(engine: str) -> None:
    fp32, logs32 = _round_update(engine=engine)
    bf16, logs16 = _round_update("precision='bf16'", engine=engine)
    noise, _ = _round_update(stream="other-minibatches", engine=engine)
    assert torch.isfinite(bf16).all()
    diff = (bf16 - fp32).norm().item()
    assert diff > 1e-4 * fp32.norm().item(), "bf16 gave the fp32 update: autocast is not on"
    assert diff <= 0.5 * (noise - fp32).norm().item()
    # The round's reports (at theta^0) are within the derived roundoff bound and differ.
    f32, f16 = np.asarray(logs32[0]["report"]), np.asarray(logs16[0]["report"])
    assert np.all(np.isfinite(f16)) and not np.array_equal(f16, f32)
    assert np.abs(f16 - f32).max() <= 2 * U_BF16 * np.abs(f32).max()


@pytest.mark.needs_data
def test_bf16_gradients_within_roundoff_bound() -> None:
    cfg = small_config()
    data = small_data(cfg)
    theta = get_flat(new_model(cfg, data, 0))
    grads = {}
    for precision in ("fp32", "bf16"):
        c = small_config(f"precision='{precision}'")
        grads[precision] = make_engine(c, new_model(c, data, 0), data, 0, "t").gradients(theta, np.arange(4),
                                                                                        np.eye(2), 0)
    assert grads["bf16"].dtype == torch.float32
    rel = ((grads["bf16"] - grads["fp32"]).norm() / grads["fp32"].norm()).item()
    assert 0 < rel <= 4 * LENET_WEIGHT_LAYERS * U_BF16


@pytest.mark.needs_data
def test_bf16_evaluation_is_autocast_and_close() -> None:
    cfg32, cfg16 = small_config(), small_config("precision='bf16'")
    data = small_data(cfg32)
    theta = get_flat(new_model(cfg32, data, 0))
    e32 = evaluate(cfg32, new_model(cfg32, data, 1).eval(), theta, data)
    e16 = evaluate(cfg16, new_model(cfg16, data, 1).eval(), theta, data)
    assert e16["task_loss"] != e32["task_loss"]
    for a, b in zip(e16["task_loss"], e32["task_loss"]):
        assert math.isfinite(a) and abs(a - b) <= 2 * U_BF16 * abs(b)


@pytest.mark.needs_data
def test_bf16_run_completes_with_finite_metrics(tmp_path: Path) -> None:
    """Calibration, training, evaluation and the run files, end to end on the CPU."""
    cfg = load_config("multimnist", [*SMALL, "rounds=2", "precision='bf16'"])
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    for key in ("mean_acc", "worst_acc", "mean_loss", "hv"):
        assert math.isfinite(summary[key]), key
    assert 'precision = "bf16"' in (tmp_path / "run" / "config.toml").read_text()
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 2 and all(math.isfinite(v) for r in rounds for v in r["report"])


@pytest.mark.needs_data
@pytest.mark.parametrize("engine", ["batched", "sequential"])
def test_fp32_is_unchanged_bit_for_bit(engine: str) -> None:
    """``precision = "fp32"`` (the default) runs exactly the code of a configuration without the key."""
    assert small_config().precision == "fp32"
    unset, logs_unset = _round_update(engine=engine)
    fp32, logs_fp32 = _round_update("precision='fp32'", engine=engine)
    assert torch.equal(unset, fp32)
    assert [r["report"] for r in logs_unset] == [r["report"] for r in logs_fp32]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["precision='bf16'", "dtype='float64'"], r"precision = \"bf16\" needs dtype = \"float32\".*dtype = 'float64'"),
        (["precision='fp16'"], r"precision = 'fp16' is not supported; choose one of fp32, bf16"),
    ],
)
def test_bad_precision_is_one_line_error(overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_config("multimnist", overrides)
    assert "\n" not in str(info.value)

