"""``baselines/fedhv``: FedHV in Flower Baselines' form (client_app, server_app, dataset with Flower Datasets,
model, strategy), run with ``flwr run .`` in its folder on Flower's Simulation Engine: each node loads the client
fedhv's own ``multimnist`` run uses, and the weights the run sent follow FedHV's map from its own reports; every
socket the run's processes listen on (Ray's included) is a loopback address."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from listening import exposed, run_watching

from conftest import REPO

BASELINE = REPO / "baselines" / "fedhv"
RUN = {"num-nodes": 4, "num-server-rounds": 5, "calibration-rounds": 2, "fraction-train": 1.0,
       "samples-per-client": 64, "local-steps": 3, "test-samples": 500}


def _env(tmp_path: Path, token: str, data_root: Path) -> dict[str, str]:
    from fedhv.flower.procs import free_ports

    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n')
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_ports(1)[0]),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FEDHV_DEPLOYMENT": token, "FEDHV_DATA": str(data_root),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


@pytest.mark.needs_data
def test_the_baseline_loads_the_papers_clients(data_root: Path) -> None:
    from fedhv.config import load_config
    from fedhv.data.configured import load_data

    sys.path.insert(0, str(BASELINE))
    try:
        from fedhv_baseline.dataset import load_partition
    finally:
        sys.path.pop(0)
    cfg = load_config("multimnist", (f"data.root={str(data_root)!r}", "partition.clients=4",
                                     "partition.samples_per_client=64", "train.clients_per_round=4"))
    bench, parts = load_data(cfg)
    for k in range(4):
        x, y = load_partition(k, 4, str(data_root), 64, 0.15, 10)
        want = (torch.from_numpy(bench.train_x[parts[k]]).float() / 255 - bench.mean[0]) / bench.std[0]
        assert torch.equal(x[:, 0], want) and torch.equal(y, torch.from_numpy(bench.train_y[parts[k]]).long())


@pytest.mark.needs_data
def test_flwr_run_in_the_baseline_folder_trains_fedhv(tmp_path: Path, data_root: Path) -> None:
    from fedhv.flower.lifetime import sweep

    token, out = uuid.uuid4().hex, tmp_path / "result.json"
    config = " ".join(f"{k}={v}" for k, v in RUN.items()) + f' out="{out}"'
    try:  # the sockets every process of the run listens on, sampled while it runs
        res, sockets = run_watching([str(Path(sys.executable).parent / "flwr"), "run", ".", "sim",
                                     "--federation-config", "num-supernodes=4 client-resources-num-cpus=1",
                                     "--run-config", config, "--stream"],
                                    token, timeout=540, cwd=BASELINE, env=_env(tmp_path, token, data_root))
    finally:
        sweep(token, grace_s=3.0)
    log = res.stdout + res.stderr
    assert res.returncode == 0 and "fedhv_baseline: fedhv on 4 nodes, final test" in log, log[-3000:]
    # the Simulation Engine's Ray (GCS, raylet, agents, workers) and the local SuperLink: loopback only (issue 52:
    # Ray, which has no authentication, listened on every interface and registered the host's address)
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sorted(sockets)  # not vacuous
    assert not exposed(sockets), f"listening beyond the loopback: {exposed(sockets)}"
    result = json.loads(out.read_text())
    weights = {int(r): np.asarray(w) for r, w in result["task_weights"].items()}
    reports = {int(r): np.asarray(v) for r, v in result["reports"].items()}
    ref = np.asarray(result["reference"])
    assert sorted(weights) == list(range(1, RUN["num-server-rounds"] + 1))
    np.testing.assert_allclose(weights[1], [0.5, 0.5])
    for r in range(2, RUN["num-server-rounds"] + 1):  # w^{t+1} ∝ 1 / max(r - F^t, 1e-6), from the run's own reports
        inv = 1 / np.maximum(ref - reports[r - 1], 1e-6)
        np.testing.assert_allclose(weights[r], inv / inv.sum(), rtol=1e-12)
    assert not np.allclose(weights[RUN["num-server-rounds"]], 0.5, atol=1e-3)  # the weights moved
    assert 0 <= result["test"]["worst_acc"] <= result["test"]["mean_acc"] <= 100
