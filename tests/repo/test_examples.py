"""The examples of issue 14 run end to end at small size; their printed numbers are checked
against an independent evaluation (a plain-torch recomputation, chance levels, the simplex)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import REPO

EXAMPLES = REPO / "examples"
PUBLIC = {"fedhv", "fedhv.weighting"}


def _run(name: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), "--small"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _numbers(line: str) -> list[list[float]]:
    """The bracketed lists of numbers on ``line``."""
    return [[float(v) for v in group.split(",")] for group in re.findall(r"\[([^\]]*)\]", line)]


def _line(out: str, prefix: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("name", ["own_mlp.py", "three_losses.py", "hv_centralized.py", "fine_tune.py"])
def test_examples_import_only_public_fedhv_names(name: str) -> None:
    tree = ast.parse((EXAMPLES / name).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    fedhv_modules = {m for m in modules if m.split(".")[0] == "fedhv"}
    assert fedhv_modules and fedhv_modules <= PUBLIC, fedhv_modules
    assert {m.split(".")[0] for m in modules} <= {"argparse", "torch", "fedhv"}
    assert len((EXAMPLES / name).read_text().splitlines()) < 80


@pytest.mark.deploy
def test_three_losses_example_learns_every_task() -> None:
    out = _run("three_losses.py")
    score, loss = _numbers(_line(out, "fedhv round 8:"))
    (weights,) = _numbers(_line(out, "weights"))
    (before,) = _numbers(_line(out, "check before:"))
    (after,) = _numbers(_line(out, "check after:"))
    assert len(score) == len(loss) == len(weights) == 3
    # fedhv's evaluation (custom score functions) equals the example's plain-torch recomputation
    assert score[0] == pytest.approx(after[0], abs=0.01) and score[1] == pytest.approx(after[1], abs=0.01)
    assert after[0] > 50 and after[1] > 60  # chance: 33.3 % (3 classes), 50 % (attributes)
    assert after[2] < 0.5 * before[2]  # regression MSE at least halved
    assert sum(weights) == pytest.approx(1.0, abs=1e-3) and min(weights) > 0


@pytest.mark.deploy
def test_hv_centralized_example_module_and_adapter_agree_and_learn() -> None:
    out = _run("hv_centralized.py")
    for how in ("module", "adapter"):
        line = _line(out, f"{how}:")
        first, last, weights = _numbers(line)
        assert all(b < a for a, b in zip(first, last)), line  # every task's test loss fell
        assert float(re.search(r"accuracy ([\d.]+) %", line).group(1)) > 75  # type: ignore[union-attr]  # chance 50 %
        assert sum(weights) == pytest.approx(1.0, abs=1e-3)
        assert float(line.rsplit(" ", 1)[1]) < 1e-6  # every step's weights on the simplex
    assert float(_line(out, "max |theta_module").rsplit(" ", 1)[1]) == 0.0  # the two ways are the same update


@pytest.mark.deploy
@pytest.mark.needs_data
def test_mnist_writers_example_bn_mixed_tasks_small_and_empty_clients() -> None:
    """Issue 27's own problem: fedhv's scores of History.model equal a plain-PyTorch evaluation."""
    out = _run("mnist_writers.py")
    (sizes,) = _numbers(_line(out, "clients 41:"))
    assert sizes[0] == 0 and sizes[1] < 16  # an empty client and clients smaller than the batch
    for method in ("fedhv", "fedhv-scale-free", "uniform"):
        line = _line(out, f"{method}: scores")
        (scores,) = _numbers(line)
        (plain,) = _numbers(_line(out, f"{method} plain torch:"))
        assert scores == pytest.approx(plain, abs=2e-4), (line, plain)
        assert "(accuracy, accuracy, mse)" in line and "engine batched" in line
        mean_acc = float(re.search(r"MeanAcc ([\d.]+)", line).group(1))  # type: ignore[union-attr]
        assert mean_acc == pytest.approx((scores[0] + scores[1]) / 2, abs=0.01)  # the MSE is not averaged in


@pytest.mark.deploy
def test_fine_tune_example_keeps_the_encoder_frozen_and_its_scores_are_plain_pytorchs() -> None:
    """docs/api.md's fine-tuning example: FedHV and Uniform on a frozen pretrained encoder; fedhv's test
    scores equal a plain-PyTorch evaluation of History.model, and the encoder is bit-identical."""
    out = _run("fine_tune.py")
    for method in ("FedHV", "Uniform"):
        line = _line(out, f"{method}:")
        fedhv_scores, plain = _numbers(line)
        assert line.endswith("encoder unchanged True"), line
        assert fedhv_scores[0] == pytest.approx(plain[0], abs=1e-4)  # accuracy (%)
        assert fedhv_scores[1] == pytest.approx(plain[1], rel=1e-5)  # MSE: float32 outputs, float64 means
        assert plain[0] > 55  # the majority class is 50 %: the heads learned on the frozen features


@pytest.mark.deploy
@pytest.mark.needs_data
def test_hf_parquet_writers_example_natural_clients_from_a_partitioner_and_every_method_learns() -> None:
    """Issue 42's example: a local parquet dataset read offline, one client per writer through Flower Datasets'
    NaturalIdPartitioner; both FedHVs move their weights, Uniform keeps 1/2, all learn the digit well above chance."""
    out = _run("hf_parquet_writers.py")
    line = _line(out, "clients ")
    assert line.startswith("clients 24 (writer-00 ... writer-23)") and "x (1200, 1, 28, 28)" in line
    assert "tasks [('digit', 10), ('high', 2)]" in line
    low, high = (int(v) for v in re.search(r"sizes (\d+) \.\. (\d+)", line).groups())  # type: ignore[union-attr]
    assert 0 < low < high  # writers of unequal sizes
    for method in ("fedhv", "fedhv-scale-free", "uniform"):
        scores, weights = _numbers(_line(out, f"{method}: "))
        assert scores[0] > 30 and scores[1] > 55, scores  # chance: 10 % and about 50 %
        assert (weights == [0.5, 0.5]) == (method == "uniform") and sum(weights) == pytest.approx(1, abs=2e-3)
