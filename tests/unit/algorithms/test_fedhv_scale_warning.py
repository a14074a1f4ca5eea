"""FedHV warns before round 1 when its tasks' losses move on different scales (issue 40, item 4).

The paper's map weighs raw slacks ``r_i - F_i``: when the calibrated ranges ``d_i = r_i - min_t F_i^t``
differ by more than 2x, the task whose loss moves most gets the least weight; one warning names the
scale-free variant. No warning on comparable scales, with the variant on, or with a given reference.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pytest

import fedhv
from fedhv.algorithms.fedhv import SCALE_WARNING, warn_on_scales
from fedhv.experiment.calibration import CalibrationResult


@dataclass
class _Context:
    """A BuildContext with a calibration of the given per-task reports (no data, no model)."""

    reports: list[list[float]]
    margin: float = 0.15
    task_names: tuple[str, ...] = ("digit", "parity")
    seed: int = 0
    benchmark: str = "toy"
    asked: list[str] = field(default_factory=list)

    @property
    def num_tasks(self) -> int:
        return len(self.task_names)

    def calibration(self) -> CalibrationResult:
        self.asked.append("calibration")
        top = np.max(self.reports, axis=0)
        return CalibrationResult((top + self.margin).tolist(), top.tolist(), self.margin, [0], {"0": self.reports})

    def initial_losses(self) -> np.ndarray:
        return np.zeros(self.num_tasks)

    def task_slices(self):  # type: ignore[no-untyped-def]
        raise AssertionError("FedHV needs no encoder / head split")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "different scales" in r.getMessage()]


def test_the_warning_names_the_task_and_the_variant(caplog: pytest.LogCaptureFixture) -> None:
    # digit: 2.30 -> 0.40 (range 2.05 with the margin), parity: 0.69 -> 0.45 (range 0.39): 5.3x
    ctx = _Context([[2.30, 0.69], [1.10, 0.55], [0.40, 0.45]])
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        fedhv.FedHV().build(ctx)
    (message,) = _warnings(caplog)
    assert "digit 2.05, parity 0.39, 5.3x > 2x" in message and "so digit gets the least weight" in message
    assert 'fedhv.slack_scale = "calibrated-range"' in message


def test_no_warning_on_comparable_scales_with_the_variant_or_a_given_reference(
        caplog: pytest.LogCaptureFixture) -> None:
    same = _Context([[2.30, 2.30], [1.50, 1.20], [0.90, 0.70]])  # ranges 1.55 and 1.75
    far = _Context([[2.30, 0.69], [0.40, 0.45]])
    with caplog.at_level(logging.WARNING, logger="fedhv"):
        fedhv.FedHV().build(same)
        fedhv.FedHV(slack_scale="calibrated-range").build(far)  # the variant is on: nothing to say
        fedhv.FedHV(reference=[3.0, 1.0]).build(far)  # a given reference: no calibration to read
    assert _warnings(caplog) == [] and far.asked == ["calibration"]  # only the variant read a calibration


def test_the_threshold() -> None:
    assert SCALE_WARNING == 2.0
    assert not warn_on_scales([1.0, 2.0], ("a", "b"))  # exactly 2x: no warning
    assert warn_on_scales([1.0, 2.01], ("a", "b"))
    assert not warn_on_scales([1.0], ("a",)) and not warn_on_scales([0.0, 3.0], ("a", "b"))
