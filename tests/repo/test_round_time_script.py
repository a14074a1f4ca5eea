"""``perf/round_time.py``'s end-to-end projection (the paper's Table 13 accounting)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedhv.config import load_config

from conftest import REPO

PERF = REPO / "perf"


@pytest.fixture(scope="module")
def script():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(PERF))
    try:
        import round_time

        yield round_time
    finally:
        sys.path.remove(str(PERF))


@pytest.mark.parametrize(("rounds", "period", "final", "evals"), [(500, 3, True, 167), (300, 3, True, 100),
                                                                  (300, 3, False, 100), (10, 0, True, 1),
                                                                  (10, 5, True, 2), (10, 5, False, 2),
                                                                  (11, 5, True, 3)])
def test_evaluations_per_run(script, rounds: int, period: int, final: bool, evals: int) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config("cifar10-mnist-b", [f"rounds={rounds}", f"eval.test_period={period}",
                                          f"eval.final={str(final).lower()}"])
    assert script.evaluations_per_run(cfg) == evals


def test_end_to_end_adds_evaluations_to_all_and_the_calibration_to_fedhv(script) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config("cifar10-mnist-b", ["rounds=300", "calibration.rounds=20", "calibration.seeds=[0, 1]"])
    per_round = {"uniform": 5.0, "fedhv": 6.0, "fsmgda": 9.0}
    got = script.end_to_end(cfg, per_round, report_s=0.5, eval_s=2.0)
    evals = 100 * 2.0  # 300 rounds, an evaluation every 3 rounds, the last one at round 300
    assert got == pytest.approx({"uniform": 300 * 5.0 + evals, "fsmgda": 300 * 9.0 + evals,
                                 "fedhv": 300 * 6.0 + evals + 2 * 20 * (5.0 + 0.5)})
    fixed = load_config("cifar10-mnist-b", ["rounds=300", "fedhv.reference=[3.0, 3.0]"])
    assert script.end_to_end(fixed, per_round, 0.5, 2.0)["fedhv"] == pytest.approx(300 * 6.0 + evals)


def test_peak_flop_counts_match_torchs_flop_counter() -> None:
    sys.path.insert(0, str(PERF))
    try:
        import peak
    finally:
        sys.path.remove(str(PERF))

    a = torch.randn(48, 48)
    x, w = torch.randn(3, 5, 16, 16), torch.randn(7, 5, 3, 3)
    for fn, expected in ((lambda: a @ a, peak.matmul_flops(48)),
                         (lambda: F.conv2d(x, w, padding=1), peak.conv_flops(3, 5, 7, 16, 3))):
        counter = FlopCounterMode(display=False)
        with counter:
            fn()
        assert counter.get_total_flops() == expected
    results = peak.measure(torch.device("cpu"), (torch.float32,), (64,))
    assert set(results) == {"matmul 64 float32", "conv3x3 64ch float32"} and all(v > 0 for v in results.values())
    assert peak.fp32_peak({"matmul 64 float32": 3.0, "conv3x3 64ch float32": 5.0, "matmul 64 bfloat16": 9.0}) == 5.0
