"""Every loss-only method as a Flower Strategy (real flwr Strategies and Messages over the in-process
:class:`loopback_grid.LoopbackGrid`): the weights each round sends equal what the simulator's round logic
(:class:`fedhv.algorithms.loss_only.LossOnlyAlgorithm`, built by the method's own ``build``) gives from the
same averaged reports; STCH calibrates first; the weighting composes with FedAdam; bad choices are refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.serverapp.strategy import FedAdam

import fedhv
from fedhv.algorithms import DWAConfig, LinearConfig, Replies, RLWConfig
from fedhv.errors import ConfigError
from fedhv.flower.strategy import LossWeightingStrategy, fedhv_strategy
from fedhv.flower.strategy_rules import StrategyCalibration
from loopback_grid import task_identity
from unit.flower.test_strategy_flower import M, grid, initial, sampling

from helpers import ScriptedFederation

#: RLW's per-round draw: the only form a Strategy can send (its default draws on the clients at every step).
RLW_ROUND = fedhv.RLW(config=RLWConfig(draw="round"))
METHODS = [fedhv.DWA(config=DWAConfig(window=1)), fedhv.FAMO(), RLW_ROUND, fedhv.InverseLoss(),
           fedhv.Linear(config=LinearConfig(weights=[3.0, 1.0])), fedhv.STCH()]


@pytest.fixture(autouse=True)
def identity() -> Any:
    yield from task_identity()


class _Context:
    """The simulator's BuildContext for the oracle (no model: the loss-only rules read none)."""

    def __init__(self, seed: int, calibration: StrategyCalibration | None) -> None:
        self.num_tasks, self.task_names, self.seed, self.benchmark = M, ("a", "b"), seed, "loopback"
        self._calibration = calibration

    def task_slices(self) -> Any:
        raise AssertionError("not used")

    def calibration(self) -> StrategyCalibration:
        assert self._calibration is not None
        return self._calibration

    def initial_losses(self) -> np.ndarray:
        raise AssertionError("not used")


def simulator_weights(method: Any, reports: list[list[float]], seed: int,
                      calibration: StrategyCalibration | None) -> list[list[float]]:
    """The weights the simulator's round logic sends in each round, fed the Strategy's averaged reports."""
    algorithm = method.build(_Context(seed, calibration)).algorithm
    state = algorithm.init_state(M)
    theta = torch.zeros(3, dtype=torch.float64)
    replies = [Replies(np.array([0]), reports=torch.tensor([r], dtype=torch.float64),
                       deltas=torch.zeros(1, 1, 3, dtype=torch.float64)) for r in reports]
    federation = ScriptedFederation(np.array([0]), replies)
    sent = []
    for _ in reports:
        step = algorithm.round(state, theta, federation)
        sent.append(step.log["weights"])
        state = step.state
    return sent


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_each_round_sends_what_the_simulators_rule_gives(method: Any) -> None:
    strategy = LossWeightingStrategy(method, M, seed=5, calibration_rounds=2, **sampling())
    strategy.start(grid=grid(), initial_arrays=initial(), num_rounds=5)
    cal = [h for h in strategy.history if h["phase"] == "calibration"]
    run = [h for h in strategy.history if h["phase"] == "train"]
    assert len(run) == 5 and len(cal) == (2 if method.uses_calibration() else 0)
    calibration = StrategyCalibration([0.0, 0.0], {"0": [h["report"] for h in cal]}, [0.0, 0.0], 0.0) if cal else None
    expected = simulator_weights(method, [h["report"] for h in run], seed=5, calibration=calibration)
    np.testing.assert_allclose([h["weights"] for h in run], expected, rtol=1e-12, atol=1e-15)
    assert len({tuple(np.round(w, 12)) for w in expected}) > (1 if method.name != "linear" else 0)


def test_rlw_draws_follow_the_seed_and_stch_uses_the_calibration_mean() -> None:
    def weights(method: Any, seed: int) -> list[list[float]]:
        s = LossWeightingStrategy(method, M, seed=seed, calibration_rounds=3, **sampling())
        s.start(grid=grid(), initial_arrays=initial(), num_rounds=3)
        return [h["weights"] for h in s.history if h["phase"] == "train"]

    assert weights(RLW_ROUND, 1) == weights(RLW_ROUND, 1) != weights(RLW_ROUND, 2)
    s = LossWeightingStrategy("stch", M, calibration_rounds=3, **sampling())
    s.start(grid=grid(), initial_arrays=initial(), num_rounds=2)
    cal = np.array([h["report"] for h in s.history if h["phase"] == "calibration"])
    run = [h for h in s.history if h["phase"] == "train"]
    # STCH's nadir with mu = 1: the authors' gradient w_i = m / (z_i sum_j (F_j / z_j + 1e-20)), F the report
    z, f = cal.mean(0), np.asarray(run[0]["report"])
    np.testing.assert_allclose(run[1]["weights"], M / (z * (f / z + 1e-20).sum()), rtol=1e-12)


def test_rlws_per_step_draw_is_refused_by_a_strategy_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="rlw's clients draw their task weights at every local step.*draw = \"round\""):
        LossWeightingStrategy("rlw", M, **sampling())


def test_the_weighting_composes_with_fedadam() -> None:
    strategy = fedhv_strategy(FedAdam, M, weighting="dwa", eta=0.05, **sampling())
    assert isinstance(strategy, FedAdam)
    strategy.start(grid=grid(), initial_arrays=initial(), num_rounds=4)
    run = [h for h in strategy.history if h["phase"] == "train"]
    expected = simulator_weights(fedhv.DWA(), [h["report"] for h in run], 0, None)
    np.testing.assert_allclose([h["weights"] for h in run], expected, rtol=1e-12)
    assert run[2]["weights"] != [0.5, 0.5]


@pytest.mark.parametrize(("weighting", "message"), [
    ("fsmgda", "not a loss-only method"), ("fedcmoo-upgrad", "not a loss-only method"),
    ("nope", "use 'fedhv', 'uniform' or a loss-only method (dwa, famo"),
])
def test_methods_without_the_loss_only_protocol_are_refused(weighting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        fedhv_strategy(FedAdam, M, weighting=weighting)
    with pytest.raises(ConfigError, match="reference is FedHV's; dwa takes none"):
        fedhv_strategy(FedAdam, M, [1.0, 1.0], weighting="dwa")
    with pytest.raises(ConfigError, match="linear.weights has 3 values"):
        LossWeightingStrategy(fedhv.Linear(config=LinearConfig(weights=[1.0, 1.0, 1.0])), M)
