"""Every weight rule's output is checked, and a resumed rule's memory is range-checked (issue 52).

Accepted finite settings once gave NaN or all-zero weights that a run trained on (exit 0) or blamed on the
learning rate; a tampered FAMO / DWA memory (digest recomputed) gave a raw traceback or NaN weights. Now a
rule's weights must be finite and on the simplex (STCH's scaled weights: finite, non-negative, a positive sum;
the Gramian aggregators': finite), else one line names the round, the weights, the settings that produced
them and their defaults; a solver failing on a setting says the same; a memory of the wrong shape or sign is
refused on load with one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.algorithms import Replies
from fedhv.algorithms.dwa import DWAConfig, DynamicWeightAverage
from fedhv.algorithms.famo import FAMORule
from fedhv.algorithms.fedhv import FedHVAlgorithm
from fedhv.algorithms.linear import FixedWeights
from fedhv.algorithms.loss_only import LossOnlyAlgorithm, LossOnlyState, ScaledLossOnlyState, normalized
from fedhv.algorithms.plain import StateError
from fedhv.algorithms.weight_check import WeightRuleError, check_weights

from helpers import ScriptedFederation, small_config

# the rules below overflow on purpose (that is what the checks catch)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _round(algorithm: Any, state: Any, report: list[float]) -> Any:
    replies = Replies(np.array([0]), reports=torch.tensor([report], dtype=torch.float64),
                      deltas=torch.zeros(1, 1, 3, dtype=torch.float64))
    return algorithm.round(state, torch.zeros(3, dtype=torch.float64), ScriptedFederation(np.array([0]), [replies]))


def test_nan_weights_name_the_setting_that_made_them_and_its_default() -> None:
    """``dwa.temperature = 1e-320`` (now refused by its bound; built here directly) overflowed the softmax."""
    section = DWAConfig(temperature=1e-320)
    alg = LossOnlyAlgorithm(DynamicWeightAverage(1e-320), 1.0, "dwa", section=section)
    state = _round(alg, alg.init_state(2), [2.3, 0.7]).state
    with pytest.raises(WeightRuleError) as info:
        _round(alg, state, [2.0, 0.72])
    message = str(info.value)
    assert message.startswith("round 2: dwa's task weights [nan, nan] are not finite"), message
    assert "dwa.temperature = 1e-320" in message and "set dwa.temperature = 2.0 (the default)" in message
    assert "the averaged report [2, 0.72]" in message and "\n" not in message


def test_weights_at_the_defaults_blame_the_reports() -> None:
    """DWA at its defaults with a report of 0 (a ratio 0 / 0): no setting to blame, the losses are."""
    alg = LossOnlyAlgorithm(DynamicWeightAverage(), 1.0, "dwa", section=DWAConfig())
    state = _round(alg, alg.init_state(2), [0.0, 0.7]).state
    with pytest.raises(WeightRuleError, match=r"round 2: dwa's task weights .* are not finite; dwa.temperature = 2.0, "
                                              r"dwa.window = 1 made them .*the settings are the defaults.*losses"):
        _round(alg, state, [0.0, 0.72])


@pytest.mark.parametrize(("weights", "kind", "wrong"), [
    ([0.0, 0.0], "simplex", "sum to 0, not 1"),
    ([0.0, 0.0], "scaled", "sum to 0 (no task is trained)"),
    ([-0.5, 1.5], "simplex", "have a negative entry"),
    ([-0.5, 1.5], "scaled", "have a negative entry"),
    ([0.5, 0.75], "simplex", "sum to 1.25, not 1"),
    ([np.inf, 1.0], "finite", "are not finite"),
])
def test_each_kind_of_weights_is_checked(weights: list[float], kind: str, wrong: str) -> None:
    with pytest.raises(WeightRuleError, match=f"round 4: m's task weights .* {wrong.replace('(', '.').replace(')', '.')}"):
        check_weights(np.array(weights), name="m", round_index=3, kind=kind, source="x", num_tasks=2)
    assert check_weights([0.5, 0.75], name="m", round_index=0, kind="scaled", source="x").sum() == 1.25
    assert check_weights([-2.0, 3.0], name="m", round_index=0, kind="finite", source="x").tolist() == [-2.0, 3.0]


def test_stch_scaled_weights_must_stay_non_negative_with_a_positive_sum() -> None:
    alg = LossOnlyAlgorithm(FixedWeights(np.array([0.0, 0.0])), 1.0, "stch", state_class=ScaledLossOnlyState)
    with pytest.raises(WeightRuleError, match=r"stch's task weights \[0, 0\] sum to 0"):
        alg.init_state(2)


def test_huge_linear_preferences_normalise_exactly() -> None:
    """``linear.weights = [1e308, 1e308]`` summed to inf and normalised to zeros; [1e-320, 1e-320] to NaN."""
    assert normalized(np.array([1e308, 1e308])).tolist() == [0.5, 0.5]
    assert normalized(np.array([1e-320, 3e-320])).tolist() == pytest.approx([0.25, 0.75], rel=1e-2)
    assert normalized(np.array([2.0, 1.0, 1.0])).tolist() == [0.5, 0.25, 0.25]


def test_fedhv_weights_are_checked_naming_the_reference() -> None:
    alg = FedHVAlgorithm(np.array([np.inf, np.inf]), 1.0)  # r overflowed (--margins 1e308 before its bound)
    with pytest.raises(WeightRuleError, match=r"fedhv's task weights \[nan, nan\] are not finite; .*the reference "
                                              r"r = \[inf, inf\] \(fedhv.reference, or calibration.margin"):
        _round(alg, alg.init_state(2), [2.3, 0.7])


def test_a_solver_failing_on_a_setting_is_one_line_naming_it() -> None:
    """``fsmgda-cagrad.c = 1e308`` (now refused by its bound) made the cone program fail mid-run."""
    from fedhv.algorithms.gramian import GramianState, _rule_weights
    from fedhv.registry import METHODS

    section = METHODS.get("fsmgda-cagrad").section(c=1e308)
    with pytest.raises(WeightRuleError) as info:
        _rule_weights(section, np.array([[1.0, 0.2], [0.2, 2.0]]), GramianState(np.full(2, 0.5), 4), 0,
                      name="fsmgda-cagrad")
    message = str(info.value)
    assert message.startswith("round 5: fsmgda-cagrad's solver failed (SolverError"), message
    assert "fsmgda-cagrad.c = 1e+308" in message and "set fsmgda-cagrad.c = 0.4 (the default)" in message
    assert "\n" not in message


def test_a_strategys_weights_are_checked_too() -> None:
    """A Flower Strategy runs the same rules (and FedHV's map) outside the simulator's round: same check."""
    pytest.importorskip("flwr")
    import fedhv
    from fedhv.flower.strategy import LossWeightingStrategy

    strategy = LossWeightingStrategy(fedhv.DWA(config=DWAConfig(window=2)), 2, seed=5)
    with pytest.raises(WeightRuleError, match=r"^round 1: dwa's task weights \[nan, 0.5\] are not finite; "
                                              r"dwa.temperature = 2.0, dwa.window = 2 made them from the averaged "
                                              r"report \[0, 1\]"):
        strategy._checked(np.array([np.nan, 0.5]), [0.0, 1.0])
    assert strategy._checked(np.array([0.25, 0.75]), [0.0, 1.0]).tolist() == [0.25, 0.75]


FAMO_MEMORY = (np.array([2.0, 0.7]), np.array([0.1, -0.1]), np.zeros(2), np.full(2, 1e-4), np.array([3.0]))


@pytest.mark.parametrize(("memory", "message"), [
    (FAMO_MEMORY[:4], r"famo memory has arrays of shapes \[\[2\], \[2\], \[2\], \[2\]\]"),
    ((np.zeros(3), *FAMO_MEMORY[1:]), r"shapes \[\[3\], \[2\], \[2\], \[2\], \[1\]\]"),
    ((*FAMO_MEMORY[:3], np.array([1e-4, -1e-4]), FAMO_MEMORY[4]), r"Adam second moment .* negative"),
    ((np.array([-1.0, 0.7]), *FAMO_MEMORY[1:]), r"last report \[-1.0, 0.7\] is not above famo.min_loss = 0.0"),
    ((*FAMO_MEMORY[:4], np.array([2.5])), r"step count \[2.5\] is not a whole number"),
])
def test_a_tampered_famo_memory_is_refused(memory: tuple[np.ndarray, ...], message: str) -> None:
    alg = LossOnlyAlgorithm(FAMORule(), 1.0, "famo")
    alg.check_state(LossOnlyState(np.full(2, 0.5), 4, FAMO_MEMORY))  # a real one passes
    state = LossOnlyState.from_plain(LossOnlyState(np.full(2, 0.5), 4, memory).to_plain())
    with pytest.raises(StateError, match=message):
        alg.check_state(state)


def test_a_tampered_dwa_memory_or_a_memoryless_rules_is_refused() -> None:
    dwa = LossOnlyAlgorithm(DynamicWeightAverage(window=1), 1.0, "dwa")
    with pytest.raises(StateError, match=r"dwa memory holds 3 reports; dwa.window = 1 keeps at most 2"):
        dwa.check_state(LossOnlyState(np.full(2, 0.5), 3, (np.ones(2),) * 3))
    with pytest.raises(StateError, match=r"dwa memory has reports of shapes \[\[2\], \[5\]\]"):
        dwa.check_state(LossOnlyState(np.full(2, 0.5), 3, (np.ones(2), np.ones(5))))
    linear = LossOnlyAlgorithm(FixedWeights(np.full(2, 0.5)), 1.0, "linear")
    with pytest.raises(StateError, match="FixedWeights keeps no memory, but the state holds 1 array"):
        linear.check_state(LossOnlyState(np.full(2, 0.5), 3, (np.ones(2),)))


@pytest.mark.needs_data
def test_a_tampered_famo_checkpoint_is_refused_on_resume(tmp_path: Path) -> None:
    """Digest recomputed, Adam's second moment negative: one line at resume (was NaN weights blamed on
    divergence), nothing repaired or resumed."""
    from fedhv.experiment import loop, resume_experiment, run_experiment
    from fedhv.experiment.checkpoint import CHECKPOINT_FILE, ResumeError, payload_digest

    original = loop.SimFederation.exchange

    def stop_in_round_3(self: Any, theta: torch.Tensor, request: Any) -> Any:
        if self.round_idx == 2:
            raise KeyboardInterrupt
        return original(self, theta, request)

    run = tmp_path / "famo"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop.SimFederation, "exchange", stop_in_round_3)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(small_config('method="famo"', "rounds=3"), run, progress=False)
    path = run / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=True)
    assert payload["round"] == 2 and len(payload["state"]["data"]["memory"]) == 5
    payload["state"]["data"]["memory"][3] = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    payload["digest"] = payload_digest(payload)
    torch.save(payload, path)
    saved = shutil.copytree(run, tmp_path / "saved")
    with pytest.raises(ResumeError, match=r"invalid algorithm state: famo memory's Adam second moment \[-1.0, 1.0\] "
                                          r"has a negative entry.*delete it to restart"):
        resume_experiment(run, progress=False)
    assert (run / CHECKPOINT_FILE).read_bytes() == (saved / CHECKPOINT_FILE).read_bytes()
