"""Readers of received runs skip malformed values with a warning, never a traceback; the JSON fedhv
writes stays strict (RFC 8259: no bare ``NaN`` / ``Infinity``). Runs are copies of the session's
small grid (``conftest.small_grid``) with values planted in their files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL

RUN = Path("multimnist") / "fedhv" / "s1"


@pytest.fixture
def tree(small_grid: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(small_grid, tmp_path / "tree"))


def fedhv(*args: str, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "fedhv.cli", *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fedhv {' '.join(args)} hung for {timeout} s")


def _plant(run: Path, diagnostics: object) -> None:
    """Give every ``metrics.jsonl`` record of ``run`` the diagnostics value ``diagnostics``."""
    path = run / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({**r, "diagnostics": diagnostics}) + "\n" for r in records))


BAD_DIAGNOSTICS = {
    "string-scalar": {"at_round": 1, "grad_phi_sq": "abc", "grad_phi_sq_avg": "high", "pareto_residual": 0.1},
    "list-scalar": {"at_round": 1, "grad_phi_sq_avg": [1, 2], "min_slack": {"a": 1}},
    "clients-not-objects": {"at_round": 1, "clients": {"score": ["worst", 3]}},
    "not-an-object": "lots",
    "at-round-text": {"at_round": "one", "grad_phi_sq": 1.0},
}


#: The damages also drawn by ``fedhv plot`` (seconds each): the scalar and the per-client readers.
PLOTTED = ("string-scalar", "clients-not-objects")


@pytest.mark.needs_data
@pytest.mark.parametrize("damage", list(BAD_DIAGNOSTICS))
def test_table_and_plot_skip_a_malformed_diagnostics_value(tree: Path, tmp_path: Path, damage: str) -> None:
    run = tree / RUN
    _plant(run, BAD_DIAGNOSTICS[damage])
    table = fedhv("table", str(tree), "--table", "theory,fairness,11")
    assert table.returncode in (0, 2) and "Traceback" not in table.stderr, table.stderr[-3000:]
    warnings = [ln for ln in table.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings and all(f"skipped the diagnostics of {run}/metrics.jsonl line" in w for w in warnings), \
        table.stderr
    assert "Table 11" in table.stdout  # the rest of each line is kept
    if damage not in PLOTTED:
        return
    plot = fedhv("plot", str(tree), "--out", str(tmp_path / "figs"), "--formats", "png")
    assert plot.returncode == 0 and "Traceback" not in plot.stderr, plot.stderr[-3000:]
    assert "warning: skipped the diagnostics of" in plot.stderr


@pytest.mark.needs_data
def test_valid_diagnostics_values_are_kept(tree: Path) -> None:
    from fedhv.results.collect import find_runs

    good = {"at_round": 1, "grad_phi_sq": 2.5, "grad_phi_sq_avg": None, "slack": [0.1, 0.2],
            "clients": {"score": [{"worst": 0.5, "p10": 0.6}], "loss": [{"mean": 1.0}]}}
    _plant(tree / RUN, good)
    runs = {(r.method, r.seed): r for r in find_runs(tree)[0]}
    assert all(e["diagnostics"] == good for e in runs[("fedhv", 1)].metrics)


@pytest.mark.needs_data
def test_a_fifo_in_a_received_run_is_skipped_not_waited_for(tree: Path) -> None:
    run = tree / RUN
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    proc = fedhv("table", str(tree), "--table", "11", timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"warning: skipped {run}/metrics.jsonl: cannot be read" in proc.stderr and "FIFO" in proc.stderr


def _strict(text: str) -> object:
    def refuse(token: str) -> None:
        raise ValueError(f"bare {token} in JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.needs_data
def test_partition_stats_gradients_json_is_strict(small_grid: Path, tmp_path: Path) -> None:
    """A diverged model (NaN parameters) gives NaN gradient statistics: written as null, never NaN."""
    import torch

    state = torch.load(small_grid / RUN / "model.pt", map_location="cpu", weights_only=True)
    state["state_dict"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                           for k, v in state["state_dict"].items()}
    torch.save(state, tmp_path / "model.pt")
    sets = [a for o in SMALL for a in ("--set", o)]
    proc = fedhv("partition-stats", "multimnist", "--gradients", "--model", str(tmp_path / "model.pt"),
                 "--grad-clients", "2", "--format", "json", *sets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _strict(proc.stdout)  # raises on a bare NaN / Infinity token
    assert isinstance(report, dict)
    assert report["gradients"]["zeta_sq"] == [None, None] and report["gradients"]["grad_sq"] == [None, None]


def test_json_writers_never_write_bare_nan(tmp_path: Path) -> None:
    from fedhv.data.cache import read_json, write_json
    from fedhv.safe_io import dumps_strict

    assert dumps_strict({"a": float("nan"), "b": [float("inf"), 1.0]}) == '{"a": null, "b": [null, 1.0]}'
    assert write_json(tmp_path / "memo.json", {"x": float("nan")})
    assert _strict((tmp_path / "memo.json").read_text()) == {"x": None} and read_json(tmp_path / "memo.json")
