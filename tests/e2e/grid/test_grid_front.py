"""A front sweep run for real (``fedhv grid --front``, MultiMNIST cut small, two directions, FedHV at two
margins and linear scalarisation): each run trained against what its direction asks (FedHV's recorded
reference is the shared calibration's maximum plus delta m u, Linear's weights are 1/u normalised),
one calibration serves every run, the front table's indicators equal their numpy definitions on the
runs' own final losses, and the same command again skips every finished run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhv.cli import main
from fedhv.results.collect import find_runs
from fedhv.results.tables import build_tables

SETS = ["partition.clients=4", "partition.samples_per_client=24", "train.clients_per_round=2", "train.local_steps=2",
        "train.batch_size=12", "calibration.rounds=2", "data.max_test_samples=120", "eval.test_period=2",
        "dtype='float64'"]


@pytest.mark.needs_data
def test_a_front_sweep_aims_every_run_and_tabulates_its_front(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "front"
    args = ["grid", "multimnist", "--front", "1", "--margins", "0.15,2", "--methods", "fedhv,linear", "--seeds", "0",
            "--rounds", "2", "--quiet", "--out", str(out), *[x for s in SETS for x in ("--set", s)]]
    assert main(args) == 0
    assert "6 run(s) finished" in capsys.readouterr().out
    (cal_file,) = (out / "calibration").iterdir()
    cal = json.loads(cal_file.read_text())
    points = []
    for u in ((2 / 3, 1 / 3), (1 / 3, 2 / 3)):  # the interior lattice at H = 1: (k + 1) / (H + m)
        where = out / "multimnist" / "front" / f"u={u[0]!r},{u[1]!r}"  # exact: two directions never share one
        for delta in (0.15, 2.0):
            summary = json.loads((where / f"margin={delta:g}" / "fedhv" / "s0" / "summary.json").read_text())
            want = np.asarray(cal["max_report"]) + delta * 2 * np.asarray(u)
            np.testing.assert_allclose(summary["reference"], want, rtol=0, atol=1e-15)
            points.append(summary["task_loss"])
        rounds = [json.loads(x) for x in (where / "linear" / "s0" / "rounds.jsonl").read_text().splitlines()]
        inv = 1 / np.asarray(u)
        for r in rounds:
            np.testing.assert_allclose(r["weights"], inv / inv.sum(), rtol=0, atol=1e-15)
    runs, _ = find_runs(out)
    (table,) = build_tables(runs, ["front"])
    hv = {r.method: r.ours for r in table.records if r.metric == "front_hv"}
    assert sorted(hv) == ["fedhv@margin=0.15", "fedhv@margin=2", "linear"]
    mine = np.asarray(points[0::2])  # FedHV δ = 0.15 at both directions
    front = mine[[not any((o <= p).all() and (o < p).any() for o in mine) for p in mine]]
    front = front[np.argsort(front[:, 0])]
    area, top = 0.0, 3.0
    for x, y in front:
        area += (3.0 - x) * (top - y)
        top = y
    stat = hv["fedhv@margin=0.15"]
    assert stat is not None
    np.testing.assert_allclose(stat.mean, area, rtol=1e-12)
    assert main(args) == 0
    assert "0 run(s) finished, 6 already done" in capsys.readouterr().out
