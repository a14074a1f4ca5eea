"""Issue 29, item 1: the repository's Flower App (``flower-app/``) run with ``flwr run``.

- in Flower's Simulation Engine (Ray, from ``flwr[simulation]``): ``flwr run flower-app sim
  --federation-config num-supernodes=3 --run-config …`` as a real process, with the local
  SuperLink the Flower CLI starts itself: the run directory is complete, its rounds (clients,
  reports, weights) and model equal ``fedhv run``'s float64 run bit for bit, the run's log
  (``--stream``) shows the calibration and every round, and every process is stopped by PID
  afterwards (the Flower CLI leaves its local SuperLink running);
- the app's options: ``flower-app/pyproject.toml`` holds exactly :data:`fedhv.flower.app.DEFAULTS`,
  and bad values are one line naming the key.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import tomllib
import torch

from fedhv.config import load_config
from fedhv.experiment.runner import run_experiment
from flower_support import assert_gone, needs_flwr, rounds_of, theta_of
from listening import exposed, run_watching

from conftest import REPO

ROOT = REPO
SETS = ["partition.samples_per_client=64", "train.batch_size=16", "train.local_steps=3", "calibration.rounds=1",
        "data.max_test_samples=300", "eval.test_period=1", "dtype='float64'"]


def assert_equals_fedhv_run(out: Path, tmp_path: Path, clients: int) -> None:
    """The Flower run in ``out`` (2 rounds, seed 3, ``clients`` nodes, :data:`SETS`) against ``fedhv run``
    with the sequential engine: clients, reports, weights and the final model, bit for bit."""
    sim = tmp_path / "sim"
    run_experiment(load_config("multimnist", [*SETS, f"partition.clients={clients}",
                                              f"train.clients_per_round={clients}", "rounds=2", "seed=3",
                                              'engine="sequential"']), sim, progress=False)
    got, want = rounds_of(out), rounds_of(sim)
    assert [r["clients"] for r in got] == [r["clients"] for r in want] and len(got) == 2
    assert [r["report"] for r in got] == [r["report"] for r in want]
    assert [r["weights"] for r in got] == [r["weights"] for r in want]
    assert torch.equal(theta_of(out), theta_of(sim))
    import json

    # the nodes ran the sequential engine: config.toml and summary.json say so alike
    assert 'engine = "sequential"' in (out / "config.toml").read_text()
    assert json.loads((out / "summary.json").read_text())["engine"] == "sequential"


def test_the_app_declares_exactly_the_options_it_reads() -> None:
    from fedhv.flower.app import DEFAULTS

    app = tomllib.loads((ROOT / "flower-app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["config"] == DEFAULTS
    assert app["components"] == {"serverapp": "fedhv.flower.app:server_app", "clientapp": "fedhv.flower.app:client_app"}


@needs_flwr
def test_bad_app_options_are_one_line_naming_the_key() -> None:
    from fedhv.flower.app import app_options
    from fedhv.flower.federation import FlowerSetupError

    opts = app_options({"rounds": 5, "set": "train.lr_local=0.01; eval.test_period=5 ;"})
    assert opts.rounds == 5 and opts.overrides == ("train.lr_local=0.01", "eval.test_period=5")
    with pytest.raises(FlowerSetupError, match=r"run config rounds = -1: expected int >= 0"):
        app_options({"rounds": -1})
    with pytest.raises(FlowerSetupError, match=r"run config seed = 1.5: expected int"):
        app_options({"seed": 1.5})
    with pytest.raises(FlowerSetupError, match=r"run config keys \['lr'\] are not fedhv app options"):
        app_options({"lr": 0.1})
    # a resolved configuration (what fedhv flower local gives) replaces the keys that would change it
    assert app_options({"config": "/x/config.toml", "log": "/x/log"}).config == "/x/config.toml"
    with pytest.raises(FlowerSetupError, match=r"config = '/x/c.toml' is a whole configuration, and \['method'\]"):
        app_options({"config": "/x/c.toml", "method": "uniform"})


@needs_flwr
def test_one_serverapp_serves_flwr_run_and_fedhv_flower_local() -> None:
    """``fedhv flower local``'s generated app names the App's ServerApp; the old name is that object."""
    import fedhv.flower.server
    from fedhv.flower.app import server_app
    from fedhv.flower.runconf import app_pyproject

    assert fedhv.flower.server.app is server_app
    components = tomllib.loads(app_pyproject({"config": "x.toml"}))["tool"]["flwr"]["app"]["components"]
    assert components["serverapp"] == "fedhv.flower.app:server_app"


def _ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


@pytest.mark.needs_data
@needs_flwr
@pytest.mark.skipif(not _ray_available(), reason="the Simulation Engine needs ray: pip install -e '.[flower]'")
def test_flwr_run_of_the_app_in_the_simulation_engine_equals_fedhv_run(tmp_path: Path) -> None:
    from fedhv.flower.lifetime import marked, sweep
    from fedhv.flower.procs import free_ports

    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n')
    token = uuid.uuid4().hex  # every process of the run carries it: found and stopped by PID afterwards
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_ports(1)[0]),
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FEDHV_DEPLOYMENT": token,
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    out = tmp_path / "run"
    run_config = f'rounds=2 seed=3 clients=3 set="{"; ".join(SETS)}" out="{out}"'  # clients given: no discovery
    flwr = str(Path(sys.executable).parent / "flwr")
    seen: list[int] = []
    try:  # the sockets every process of the run listens on, sampled while it runs
        res, sockets = run_watching([flwr, "run", str(ROOT / "flower-app"), "sim", "--federation-config",
                                     "num-supernodes=3 client-resources-num-cpus=1", "--run-config", run_config,
                                     "--stream"], token, timeout=540, env=env)
        seen = marked(token)
    finally:
        sweep(token, grace_s=3.0)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    # the Simulation Engine's Ray and the local SuperLink listen on the loopback only (issue 52)
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sorted(sockets)  # not vacuous
    assert not exposed(sockets), f"listening beyond the loopback: {exposed(sockets)}"
    for line in ("fedhv: calibration 1/1", "fedhv: round 1/2", "fedhv: round 2/2", "fedhv: finished: MeanAcc"):
        assert line in log, log[-3000:]
    assert "asking the SuperNodes for their partition count" not in log  # one pass over the nodes
    assert seen and not marked(token)  # the CLI's local SuperLink (and what it started) ran, and is gone
    assert_gone(set(seen))
    assert_equals_fedhv_run(out, tmp_path, clients=3)


def _sim_env(tmp_path: Path, token: str) -> dict[str, str]:
    from fedhv.flower.procs import free_ports

    home = tmp_path / "flwr-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n')
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_ports(1)[0]),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FEDHV_DEPLOYMENT": token,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def _plain_fedhv(calibration_rounds: int, rounds: int, nodes: int, lr: float, steps: int
                 ) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    """The oracle: FedHV written out in plain PyTorch / numpy over the example's own model and local
    training (calibration: uniform rounds from the initial model, r = max report + 0.15; then the
    rounds from the initial model again, w^{t+1} ∝ 1 / max(r − F^t, 1e-6)); the final state and the
    weights of every round of the run."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "examples" / "flower_own_app"))
    try:
        from own_app.task import Net, local_update
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    initial = {k: v.clone() for k, v in Net().state_dict().items()}

    def one_round(state: dict[str, torch.Tensor], w: list[float], r: int) -> tuple[dict, list[float]]:
        states, reports = [], []
        for k in range(nodes):
            model = Net()
            model.load_state_dict(state)
            report, _ = local_update(model, k, nodes, w, r, lr, steps)
            states.append(model.state_dict())
            reports.append(report)
        mean = {key: torch.stack([s[key].double() for s in states]).mean(0) for key in state}
        return mean, np.mean(reports, axis=0).tolist()

    state, uniform, seen = initial, [0.5, 0.5], []
    for r in range(1, calibration_rounds + 1):
        state, report = one_round(state, uniform, r)
        seen.append(report)
    reference = np.max(seen, axis=0) + 0.15
    state, w, used = initial, uniform, []
    for r in range(1, rounds + 1):
        used.append(list(w))
        state, report = one_round(state, w, r)
        inv = 1.0 / np.maximum(reference - np.asarray(report), 1e-6)
        w = (inv / inv.sum()).tolist()
    return state, used


@needs_flwr
@pytest.mark.skipif(not _ray_available(), reason="the Simulation Engine needs ray: pip install -e '.[flower]'")
def test_own_model_example_app_with_the_fedhv_strategy(tmp_path: Path) -> None:
    """``examples/flower_own_app`` — a user's own model (with BatchNorm), tasks of two kinds
    (classification and regression), a client smaller than a batch, its own ServerApp and
    ClientApp, evaluation rounds — with :class:`fedhv.flower.strategy.FedHVStrategy` in the Simulation Engine: the
    final model (weights and BatchNorm statistics) equals FedHV written out in plain PyTorch
    (:func:`_plain_fedhv`) to float32 round-off, and so do the logged weights of the last rounds."""
    import json
    import re

    import numpy as np

    from fedhv.flower.lifetime import sweep

    token = uuid.uuid4().hex
    flwr = str(Path(sys.executable).parent / "flwr")
    out = tmp_path / "final.pt"
    try:
        res, sockets = run_watching([flwr, "run", str(ROOT / "examples" / "flower_own_app"), "sim",
                                     "--federation-config", "num-supernodes=4 client-resources-num-cpus=1",
                                     "--run-config", f'num-server-rounds=6 calibration-rounds=2 out="{out}"',
                                     "--stream"], token, timeout=540, env=_sim_env(tmp_path, token))
    finally:
        sweep(token, grace_s=3.0)
    log = res.stdout + res.stderr
    assert res.returncode == 0 and "own_app: fedhv final test metrics" in log, log[-3000:]
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sorted(sockets)  # Ray ran, on the loopback
    assert not exposed(sockets), f"listening beyond the loopback: {exposed(sockets)}"
    # fedhv's own lines reach the app's Flower log, and the evaluation rounds work (every node evaluates)
    assert "fedhv: reference r = " in log and "fedhv: round 6 (train): report " in log, log[-3000:]
    evaluated = re.search(r"own_app: evaluate round 6 (\{.*\})", log)
    assert evaluated is not None and "reply of node" not in log and "no valid" not in log, log[-3000:]
    assert set(json.loads(evaluated.group(1).replace("'", '"'))) == {"acc_a", "mse_b"}
    want, weights = _plain_fedhv(2, 6, 4, 0.1, 5)
    got = torch.load(out, weights_only=True)
    assert set(got) == set(want) and "encoder.1.running_mean" in got
    for key, value in want.items():
        torch.testing.assert_close(got[key].double(), value, rtol=1e-4, atol=1e-5, msg=key)
    assert float((got["encoder.1.running_var"] - 1).abs().max()) > 0.05  # the statistics moved
    rows = [(int(m.group(1)), json.loads(m.group(2))) for m in
            re.finditer(r"own_app: train round (\d+) report \[[^\]]*\] weights (\[[^\]]*\])", log)]
    assert [r[0] for r in rows] == [4, 5, 6]
    for r, logged in rows:
        np.testing.assert_allclose(logged, weights[r - 1], atol=2e-4)  # the log rounds to 4 digits
    assert not np.allclose(weights[-1], 0.5, atol=1e-3)  # FedHV moved the weights
