"""``perf/task_scaling.py``: its m derived tasks are the documented relabelling of
MultiMNIST's two digits, and every method trains a model with m heads on them."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from fedhv.experiment.setup import new_model
from fedhv.models import get_flat

from conftest import REPO
from helpers import small_config, small_data

pytestmark = pytest.mark.needs_data  # every test here reads the real data

PERF = REPO / "perf"


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(PERF))  # task_scaling imports round_time as the script does
    try:
        import task_scaling

        yield task_scaling
    finally:
        sys.path.remove(str(PERF))


def test_derived_tasks_relabel_the_two_digits(script) -> None:  # type: ignore[no-untyped-def]
    data = small_data(small_config())
    five = script.with_tasks(data, 5)
    assert five.num_tasks == 5 and five.num_classes == (10,) * 5
    y = data.train_y.numpy()
    for j in range(5):  # task j: digit j mod 2 shifted by j // 2, for the training and the test labels
        np.testing.assert_array_equal(five.train_y[:, j].numpy(), (y[:, j % 2] + j // 2) % 10)
        test_y = data.eval_sets["test"][1].numpy()
        np.testing.assert_array_equal(five.eval_sets["test"][1][:, j].numpy(), (test_y[:, j % 2] + j // 2) % 10)
    assert torch.equal(five.train_x, data.train_x) and torch.equal(five.parts, data.parts)
    two = script.with_tasks(data, 2)
    assert torch.equal(two.train_y, data.train_y)  # m = 2 is MultiMNIST itself


@pytest.mark.parametrize("method", ["fedhv", "fsmgda", "fedcmoo"])
def test_every_method_rounds_with_m_tasks(script, method: str) -> None:  # type: ignore[no-untyped-def]
    cfg = small_config()
    data = script.with_tasks(small_data(cfg), 3)
    model = new_model(cfg, data, 0)
    assert len(model.heads) == 3
    (total, client, _, cpu), engine, _ = script.time_rounds(cfg, data, method, "batched", 1, reference=(3.0,) * 3)
    assert 0 < client <= total and cpu > 0
    reports = engine.reports(get_flat(model), np.array([0, 1]), 0, "all")  # three losses per client
    assert reports.shape == (2, 3) and torch.isfinite(reports).all()
    assert not torch.equal(reports[:, 0], reports[:, 2])  # task 2 is task 0's digit relabelled: another loss
