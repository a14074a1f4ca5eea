"""The shared reply checks of :mod:`fedhv.algorithms.validation` that the Flower paths add: the report
outlier bound and self-reported counts (the Strategies and the back-end use them; see
``test_strategy_replies`` and ``test_flower_replies`` for the reply fuzz)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhv.algorithms.validation import (
    REPORT_OUTLIER_RATIO,
    ClientReply,
    ReplySpec,
    array_problem,
    count_problem,
    report_outliers,
)


def spec(rho: float = REPORT_OUTLIER_RATIO) -> ReplySpec:
    return ReplySpec(num_tasks=2, dim=3, report=True, max_report_ratio=rho)


def replies(*reports: list[float]) -> list[ClientReply]:
    return [ClientReply(k, report=np.array(r, dtype=np.float64)) for k, r in enumerate(reports)]


def test_a_report_above_rho_times_the_lower_median_is_an_outlier_and_at_it_is_not() -> None:
    # task 0: sorted [1, 2, 3, x]; lower median 2 -> bound 20
    at = replies([1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [20.0, 1.0])
    assert report_outliers(at, spec()) == [None] * 4
    above = replies([1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [20.000001, 1.0])
    out = report_outliers(above, spec())
    assert out[:3] == [None] * 3 and out[3] is not None
    assert "task 0" in out[3] and "lower median 2" in out[3]


def test_the_bound_is_per_task_and_uses_the_lower_median() -> None:
    # task 1: [0.1, 0.2, 5.0, 5.0]: lower median 0.2 -> bound 2; both 5.0 are outliers (half the replies)
    out = report_outliers(replies([1.0, 0.1], [1.0, 0.2], [1.0, 5.0], [1.0, 5.0]), spec())
    assert [o is not None for o in out] == [False, False, True, True]
    assert all("task 1" in o for o in out[2:] if o)


def test_two_replies_the_larger_one_is_the_outlier() -> None:
    out = report_outliers(replies([1.0, 1.0], [1e6, 0.1]), spec())
    assert out[0] is None and out[1] is not None


def test_off_and_trivial_cases() -> None:
    many = replies([1.0, 1.0], [2.0, 1.0], [1e9, 1.0])
    assert report_outliers(many, spec(0.0)) == [None] * 3  # 0 = off (the simulator)
    assert report_outliers(replies([1e9, 1.0]), spec()) == [None]  # one reply: nothing to compare with
    assert report_outliers([], spec()) == []
    no_report = ReplySpec(num_tasks=2, dim=3, report=False, max_report_ratio=10.0)
    assert report_outliers(many, no_report) == [None] * 3


@pytest.mark.parametrize("value, problem", [
    (5, None), (np.int64(5), None), (5.0, None), (0, "outside"), (101, "outside"), (-1, "outside"),
    (2.5, "not an integer"), (math.nan, "not an integer"), (math.inf, "not an integer"), ("5", "not an integer"),
    (True, "not an integer"), (None, "not an integer"), ([5], "not an integer"), (10**30, "outside"),
])
def test_count_problem(value: object, problem: str | None) -> None:
    got = count_problem(value, "n", 1, 100)
    assert (got is None) if problem is None else (got is not None and problem in got and got.startswith("n = "))


@pytest.mark.parametrize("value, problem", [
    (np.zeros((1, 3)), None), (np.zeros((1, 3), np.int64), None), (np.zeros((1, 3), np.complex64), "dtype"),
    (np.zeros((1, 3), bool), "dtype"), (np.array([["a", "b", "c"]]), "dtype"), (np.zeros((1, 4)), "shape"),
    (np.array([[0.0, math.nan, 0.0]]), "non-finite"),
])
def test_array_problem(value: np.ndarray, problem: str | None) -> None:
    got = array_problem("update", value, (1, 3))
    assert (got is None) if problem is None else (got is not None and problem in got)
