"""Issue 29, item 1(b): the repository's Flower App in deployment (split from
``test_flower_app.py`` so the two files' Flower runs go to both xdist workers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from e2e.flower.test_flower_app import ROOT, SETS, assert_equals_fedhv_run
from flower_support import needs_flwr

pytestmark = pytest.mark.needs_data  # every test here reads the real data


@needs_flwr
def test_flwr_run_of_the_app_against_stock_supernodes_with_tls_and_node_auth(tmp_path: Path) -> None:
    """Deployment: ``flwr run flower-app <connection>`` against a SuperLink with TLS and SuperNode
    authentication, and stock ``flower-supernode`` processes (Flower's own ``flwr-clientapp`` per
    message, no fedhv wrapper): the rounds and the model equal ``fedhv run``'s float64 run bit for bit."""
    from fedhv.flower.local import local_deployment

    out = tmp_path / "run"
    run_config = f'rounds=2 seed=3 set="{"; ".join(SETS)}" out="{out}"'
    flwr = str(Path(sys.executable).parent / "flwr")
    with local_deployment(2, isolation="subprocess", poll_s=None, tls=True, auth=True) as dep:
        assert all("fedhv.flower" not in " ".join(map(str, p.args)) for name, p in dep.procs if "supernode" in name)
        res = subprocess.run([flwr, "run", str(ROOT / "flower-app"), "local", "--run-config", run_config, "--stream"],
                             env=dep.env, capture_output=True, text=True, timeout=540, check=False)
    log = res.stdout + res.stderr
    assert res.returncode == 0 and "fedhv: round 2/2" in log, log[-3000:]
    assert "asking the SuperNodes for their partition count" in log  # clients=0: discovered
    assert_equals_fedhv_run(out, tmp_path, clients=2)
