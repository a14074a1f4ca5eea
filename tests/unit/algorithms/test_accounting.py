"""Bytes, synchronization stages and time split of every method, from real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhv.experiment import run_experiment
from fedhv.weighting.randsvd import compression_rank, near_square_shape

from helpers import small_config

pytestmark = pytest.mark.needs_data  # every test here reads the real data

D_ENC, D_HEAD, M = 28_515, 3_060, 2
D = D_ENC + M * D_HEAD


def _sketch_bytes(d: int, m: int) -> int:
    rows, cols = near_square_shape(d, m)
    return 4 * compression_rank(d, m) * (rows + cols)


@pytest.mark.parametrize(
    ("method", "extra", "stages", "down", "up"),
    [
        ("fedhv", (), 1, 4 * (D + M), 4 * (D + M)),
        ("uniform", (), 1, 4 * D, 4 * D),
        ("fsmgda", (), 1, 4 * D, 4 * M * D),
        ("fedcmoo", (), 3, 4 * (D + M) + _sketch_bytes(D_ENC, M),
         4 * D + _sketch_bytes(D_ENC, M) + 4 * (M * M) + 4 * (2 * M * M + 2)),
        ("fedcmoo", ("fedcmoo.estimator='randsvd-direct'",), 2, 4 * (D + M), 4 * D + _sketch_bytes(D_ENC, M)),
    ],
)
def test_payloads_and_stages(method: str, extra: tuple[str, ...], stages: int, down: int, up: int,
                             tmp_path: Path) -> None:
    cfg = small_config(f"method='{method}'", "rounds=2", *extra)
    summary = run_experiment(cfg, tmp_path / "run", progress=False)
    assert summary["sync_stages"] == stages
    assert summary["bytes_down_per_client_round"] == down
    assert summary["bytes_up_per_client_round"] == up
    k = cfg.train.clients_per_round
    assert summary["bytes_down_total"] == 2 * k * down and summary["bytes_up_total"] == 2 * k * up
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    # The time split: the summary's totals are the sums of the per-round (client, server) and
    # per-evaluation times; every part is measured, so each round's is positive.
    for key, entries in (("time_client_s", rounds), ("time_server_s", rounds), ("time_eval_s", metrics)):
        assert all(e[key] > 0 for e in entries), key
        assert summary[key] == pytest.approx(sum(e[key] for e in entries), rel=1e-12), key
    assert [r["time_eval_s"] for r in rounds] == [m["time_eval_s"] for m in metrics]  # test_period = 1
    for key, per_round in (("sync_stages", stages), ("bytes_down_per_client_round", down),
                           ("bytes_up_per_client_round", up)):
        assert [m[key] for m in metrics] == [per_round, per_round], key
    for m, r in zip(metrics, rounds):
        assert (m["time_client_s"], m["time_server_s"]) == (r["time_client_s"], r["time_server_s"])
    e2e = summary["end_to_end"]
    if method == "fedhv":  # calibration is part of FedHV's end-to-end cost (Appendix D)
        cal = summary["calibration"]
        assert e2e["bytes_up"] == summary["bytes_up_total"] + cal["bytes_up"]
        assert e2e["wall_clock_s"] == pytest.approx(summary["wall_clock_s"] + cal["seconds"])
        assert e2e["rounds"] == 2 + cal["rounds"]
    else:
        assert e2e["bytes_up"] == summary["bytes_up_total"] and "calibration" not in summary
