"""Secure aggregation (SecAgg+) over TLS with SuperNode authentication: real SuperLink, SuperNodes
and ClientApp processes on 127.0.0.1, flwr 1.42's ``SecAggPlusWorkflow`` and ``secaggplus_mod``
(:mod:`fedhv.flower.secure`). One deployment (``secure=True, tls=True, auth=True``) serves every
run of the module, so ``--tls --auth --secure`` together is what is tested:

- FedHV (with its Uniform calibration), 2 rounds, float64, interrupted after round 1 (the
  ServerApp killed by PID) and resumed on the same deployment: in every round the securely
  averaged update and report equal the plain average of the same clients at the same model
  (the simulator's sequential engine, i.e. what the nodes compute) within the quantization
  step ``delta = 2c / 2**22`` (stochastic rounding: each client's error is below one step,
  so is the mean's), nothing that reaches the server holds a client's report or update, and
  the resume keeps round 1's record and continues from its model and weights;
- the same run is a complete run directory served over TLS by authenticated SuperNodes;
- FSMGDA, 4 rounds with clients lost: its one masked stage (the per-task mean updates) within
  ``delta`` of the clipped plain means; a client lost between SecAgg+ stages is recovered from the others' key shares (the round
  aggregates the rest); one lost at unmask is in the mean (``secure_unmask_lost``, not
  dropped / rejected); a client lost before sharing keys is left out; below the
  reconstruction threshold the round is skipped with its reason, the run goes on;
- a SuperNode whose key was never registered is refused (last: it must not disturb the other runs).

The refusals that need no deployment are in ``tests/unit/flower/test_secure_refusals.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.config import dumps, load_config, to_dict
from fedhv.config.loader import config_from_toml_text
from fedhv.config.schema import RunConfig
from fedhv.experiment.kill_point import PAUSE_ENV, PAUSE_FILE, PAUSE_RUN_ENV
from flower_support import HAVE_FLWR, assert_gone, checked_deployment, descendants, needs_flwr, rounds_of, theta_of

from conftest import SMALL

if HAVE_FLWR:
    from fedhv.flower.local import Deployment, FlowerRunError
    from fedhv.flower.secure import RECORD_ENV, quantization_step
    from fedhv.flower.secure_client import EXIT_ENV

NODES = 4
SECURE = [*SMALL, f"partition.clients={NODES}", "train.clients_per_round=3", 'dtype="float64"', 'engine="sequential"',
          "flower.secure_aggregation=true", "calibration.rounds=1", "eval.test_period=3", "seed=2"]
FLOAT_SLACK = 1e-12  # float64 rounding of flwr's dequantize, far below one quantization step
PAUSED_RUN = "paused-secure-run"  # the one run directory whose ServerApp pauses after round 1 (PAUSE_RUN_ENV)

Secure = tuple["Deployment", Path, Path]


@pytest.fixture(scope="module")
def secure_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[Secure]:
    """4 registered SuperNodes that answer only SecAgg+ stages, over TLS; the ServerApp records
    what reaches it (``RECORD_ENV``), the ClientApps exit where ``EXIT_ENV``'s file says (empty:
    never), and the run directory named :data:`PAUSED_RUN` pauses after round 1 (``PAUSE_ENV``)."""
    folder = tmp_path_factory.mktemp("secagg")
    record, exits = folder / "record", folder / "exits.json"
    record.mkdir()
    exits.write_text("[]")
    env = {RECORD_ENV: str(record), EXIT_ENV: str(exits), PAUSE_ENV: "1", PAUSE_RUN_ENV: PAUSED_RUN}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the deployment's processes (SuperLink -> ServerApp, ClientApps) inherit them
    try:
        with checked_deployment(request, NODES, secure=True, tls=True, auth=True) as dep:
            yield dep, record, exits
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fresh(record: Path) -> None:
    """Empty the record folder before a run (every run writes ``<stream>-<round>.*`` there)."""
    for f in record.iterdir():
        f.unlink()


def _serverapp_pids(dep: Deployment) -> list[int]:
    """The live ``flwr-serverapp`` processes the SuperLink started."""
    link = next(p for name, p in dep.procs if name == "superlink")
    found = []
    for pid in descendants(link.pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"flwr-serverapp") for part in cmd[:2]):
            found.append(pid)
    return found


def _stop_the_running_flower_run(dep: Deployment) -> None:
    """``flwr stop`` of the deployment's one running run, over its Control API (in process)."""
    from fedhv.flower.control import running_runs, stop_run

    running = running_runs(dep.port, dep.root_certificates)
    assert len(running) == 1, running
    assert stop_run(dep.port, running[0], dep.root_certificates)


def _interrupted_after_round_1(dep: Deployment, cfg: RunConfig, run: Path) -> str:
    """Submit ``cfg`` into ``run`` (named :data:`PAUSED_RUN`), wait until its ServerApp paused after
    round 1 (checkpoint written), SIGKILL it by PID and stop the Flower run; returns rounds.jsonl then."""
    assert run.name == PAUSED_RUN
    result: dict[str, Any] = {}

    def submit() -> None:
        try:
            result["run"] = dep.submit(cfg, run)
        except BaseException as exc:  # noqa: BLE001 - checked in the test thread
            result["error"] = exc

    worker = threading.Thread(target=submit, daemon=True)
    worker.start()
    deadline = time.monotonic() + 240
    while not (run / PAUSE_FILE).exists():
        assert worker.is_alive() and time.monotonic() < deadline, result
        time.sleep(0.2)
    rounds = (run / "rounds.jsonl").read_text()
    servers = _serverapp_pids(dep)
    assert len(servers) == 1, servers
    os.kill(servers[0], signal.SIGKILL)
    assert_gone(set(servers))
    _stop_the_running_flower_run(dep)  # else the SuperLink waits for the ServerApp's heartbeat (60 s)
    worker.join(60)
    assert not worker.is_alive() and isinstance(result.get("error"), FlowerRunError), result
    return rounds


@pytest.fixture(scope="module")
def fedhv_run(secure_deployment: Secure, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[RunConfig, Path, Path, str]:
    """FedHV with a 1-round Uniform calibration, 2 rounds of 3 of 4 clients, float64, over
    TLS + auth + SecAgg+, checkpointed every round, killed after round 1 and resumed: the config,
    the run directory, a copy of what reached the server per round, and rounds.jsonl at the kill."""
    dep, record, _ = secure_deployment
    _fresh(record)
    folder = tmp_path_factory.mktemp("fedhv-run")
    cfg = load_config("multimnist", [*SECURE, "rounds=2", "checkpoint.period=1"])
    run = folder / PAUSED_RUN
    at_kill = _interrupted_after_round_1(dep, cfg, run)
    assert dep.submit(None, resume=run) == run.resolve()
    kept = folder / "record"
    shutil.copytree(record, kept)
    return cfg, run, kept, at_kill


_DATA: dict[str, Any] = {}  # FederatedData by the keys it depends on (one load for the module's runs)
_VALUES: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray | None]] = {}


def client_values(cfg: RunConfig, theta: np.ndarray, clients: list[int], rows: np.ndarray, round_idx: int,
                  report: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Each client's plain update ``[k, T, d]`` and report ``[k, m]`` (``None`` unless ``report``) at
    ``theta``: the simulator's sequential engine, which computes what the nodes compute
    (``tests/e2e/flower/test_flower.py``)."""
    from fedhv.experiment.setup import federated_data, new_model
    from fedhv.sim.engine import SequentialEngine

    d = to_dict(cfg)
    memo = (dumps(d), hashlib.sha256(theta.tobytes()).hexdigest(), tuple(clients), rows.tobytes(), round_idx, report)
    if memo in _VALUES:  # the resume test re-checks the rounds the equivalence test checked
        return _VALUES[memo]
    key = json.dumps([d["data"], d["partition"], cfg.dtype, cfg.device], sort_keys=True, default=str)
    if key not in _DATA:
        _DATA[key] = federated_data(cfg)
    data, t = _DATA[key], cfg.train
    e = SequentialEngine(new_model(cfg, data, cfg.seed), data, local_steps=t.local_steps, batch_size=t.batch_size,
                         lr_local=cfg.lr_local, momentum=t.momentum, seed=cfg.seed, stream="train")
    th, ks = torch.from_numpy(theta), np.asarray(clients)
    updates = e.train(th, ks, rows, round_idx).numpy()
    _VALUES[memo] = updates, e.reports(th, ks, round_idx, cfg.fedhv.report_batches).numpy() if report else None
    return _VALUES[memo]


def assert_only_masked_values_arrive(info: dict[str, Any]) -> None:
    """Every reply that reached the server: no array (the mod cleared the update), no report, the
    masked vector as integers in SecAgg+'s config record; the strategy got weight 1 and the aggregate."""
    stages = [s["stage"] for s in info["stages"]]
    assert stages == ["setup", "share_keys", "collect_masked_vectors", "unmask"][:len(stages)]
    for st in info["stages"]:
        for reply in st["replies"]:
            if "error" in reply:
                continue
            assert all(not arrays for arrays in reply["arrays"].values()), reply  # no float array at all
            metrics = reply["metrics"]
            if st["stage"] == "collect_masked_vectors":
                assert metrics == {"fitres.num_examples": {"num_examples": 1}}, reply
                assert "masked_params" in reply["configs"]["secaggplus_configs"]
            else:
                assert metrics == {}, reply
    for got in info["strategy_received"]:
        assert got == {"node": got["node"], "num_examples": 1, "metrics": {}, "parameters_are_the_aggregate": True}


def assert_reports_are_masked(record: dict[str, np.ndarray], info: dict[str, Any], reports: np.ndarray,
                              clients: list[int], clip: float) -> None:
    """The masked report slots the server received are not the clients' quantized reports."""
    step = quantization_step(clip)
    for k, c in enumerate(clients):
        masked = record[f"masked-{info['node_map'][str(c)]}"][: reports.shape[1]] % 2**32
        scaled = (np.clip(reports[k], -clip, clip) + clip) / step
        assert not np.isin(masked, np.concatenate([np.floor(scaled), np.ceil(scaled)])).any()


def _fedhv_round_is_exact(cfg: RunConfig, r: dict[str, Any], record: Path) -> tuple[float, float]:
    """One FedHV round: only masked values arrived, the secure means are the plain means within
    delta, FedHV logged the secure mean report; returns the two largest errors."""
    clip = cfg.flower.clipping_range
    step = quantization_step(clip)
    info = json.loads((record / f"train-{r['round']}.json").read_text())
    got = dict(np.load(record / f"train-{r['round']}.npz"))
    assert_only_masked_values_arrive(info)
    assert r["secure_clients"] == r["clients"] and r["secure_clipped"] == 0 and r["sync_stages"] == 4
    assert "secure_unmask_lost" not in r and r["dropped_clients"] == r["rejected_clients"] == 0
    updates, reports = client_values(cfg, got["theta"], r["clients"], np.asarray(r["weights"])[None, :],
                                     r["round"] - 1)
    assert reports is not None
    assert np.abs(updates).max() < clip and np.abs(reports).max() < clip  # nothing clipped
    # the bound: |secure mean - plain mean| < delta per coordinate (stochastic rounding, see secure.py)
    err_d = float(np.abs(got["deltas"] - updates.mean(0)).max())
    err_r = float(np.abs(got["report"] - reports.mean(0)).max())
    assert err_d < step + FLOAT_SLACK and err_r < step + FLOAT_SLACK, (err_d, err_r, step)
    np.testing.assert_allclose(r["report"], got["report"], rtol=0, atol=0)  # FedHV used the secure mean
    assert_reports_are_masked(got, info, reports, r["clients"], clip)
    return err_d, err_r


@pytest.mark.needs_data
@needs_flwr
def test_secure_fedhv_equals_the_plain_average_within_the_quantization_step(
        fedhv_run: tuple[RunConfig, Path, Path, str]) -> None:
    """FedHV with its Uniform calibration round, 2 training rounds (3 of 4 clients each), float64:
    per round and coordinate |secure mean - plain mean| < delta = 2c / 2**22 for the update and the
    report, FedHV's logged report is the secure mean and its next model uses the secure mean update;
    the server's replies and the strategy's results hold no client's values."""
    cfg, run, record, _ = fedhv_run
    step = quantization_step(cfg.flower.clipping_range)
    assert step == 2 * cfg.flower.clipping_range / 2**22
    records = rounds_of(run)
    assert [r["round"] for r in records] == [1, 2] and not any(r.get("skipped") for r in records)
    assert len({tuple(r["clients"]) for r in records}) > 1  # 3 of 4 sampled: sampling is exercised
    calibration = json.loads((record / "calibration-1.json").read_text())
    assert calibration["extras"]["secure_clipped"] == 0 and len(calibration["extras"]["secure_clients"]) == 3
    assert_only_masked_values_arrive(calibration)
    errors = [e for r in records for e in _fedhv_round_is_exact(cfg, r, record)]
    for r in records[:-1]:  # the next round's model is theta + eta_g * the secure mean update
        got = np.load(record / f"train-{r['round']}.npz")
        nxt = np.load(record / f"train-{r['round'] + 1}.npz")["theta"]
        np.testing.assert_allclose(nxt, got["theta"] + cfg.lr_global * got["deltas"][0], rtol=0, atol=1e-15)
    assert max(errors) > 0  # the values really went through quantization
    assert theta_of(run).dtype == torch.float64


@pytest.mark.needs_data
@needs_flwr
def test_secure_run_resumed_after_round_1_keeps_round_1_and_continues_exactly(
        fedhv_run: tuple[RunConfig, Path, Path, str]) -> None:
    """The run above was SIGKILLed (its ServerApp, by PID) after round 1's checkpoint and resumed
    with ``submit(None, resume=DIR)`` on the same secure deployment: round 1's record is byte for
    byte the one written before the kill, the resumed round 2 starts from round 1's model plus the
    secure mean update and uses the weights FedHV derives from round 1's secure mean report, and
    round 2 is the plain average at its model within delta."""
    from fedhv.weighting import hv_weights

    cfg, run, record, at_kill = fedhv_run
    assert len(at_kill.splitlines()) == 1
    lines = (run / "rounds.jsonl").read_text().splitlines()
    assert len(lines) == 2 and lines[0] == at_kill.splitlines()[0]
    resumes = [json.loads(x) for x in (run / "resumes.jsonl").read_text().splitlines()]
    assert [x["round"] for x in resumes] == [1]
    r1, r2 = (json.loads(x) for x in lines)
    t1, t2 = (dict(np.load(record / f"train-{k}.npz")) for k in (1, 2))
    np.testing.assert_allclose(t2["theta"], t1["theta"] + cfg.lr_global * t1["deltas"][0], rtol=0, atol=1e-15)
    reference = np.asarray(json.loads((run / "calibration.json").read_text())["reference"])
    expected = hv_weights(np.asarray(r1["report"]), reference, cfg.fedhv.rho_clip).weights
    np.testing.assert_allclose(r2["weights"], expected, rtol=0, atol=1e-12)
    _fedhv_round_is_exact(cfg, r2, record)
    # the run's final model is round 2's model plus the secure mean update of round 2
    np.testing.assert_allclose(theta_of(run).numpy(), t2["theta"] + cfg.lr_global * t2["deltas"][0], rtol=0,
                               atol=1e-15)
    assert json.loads((run / "summary.json").read_text())["rounds"] == 2


@pytest.mark.needs_data
@needs_flwr
def test_tls_auth_and_secagg_run_is_complete(secure_deployment: Secure,
                                              fedhv_run: tuple[RunConfig, Path, Path, str]) -> None:
    """The secure FedHV run went over TLS (HTTPS SuperLink) with authenticated SuperNodes, each with
    its registered key, and left a complete run directory."""
    dep = secure_deployment[0]
    run = fedhv_run[1]
    log = (dep.workdir / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1" in log  # TLS, not plain HTTP
    assert "SuperNode authentication is disabled" not in log
    assert log.count("[Fleet.ActivateNode] Activated node_id=") == NODES  # each with its registered key
    for name in ("config.toml", "environment.json", "calibration.json", "rounds.jsonl", "metrics.jsonl",
                 "summary.json", "model.pt"):
        assert (run / name).is_file(), name
    assert config_from_toml_text((run / "config.toml").read_text()).flower.secure_aggregation


@pytest.mark.needs_data
@needs_flwr
def test_secure_fsmgda_recovers_clients_lost_between_stages_and_skips_below_threshold(
        secure_deployment: Secure, tmp_path: Path) -> None:
    """FSMGDA, 4 rounds of 4 clients, reconstruction_threshold = 3. FSMGDA's one stage (every
    client's m per-task updates, no report) is masked: in every aggregated round the per-task
    secure means Dbar_i equal the plain means of the aggregated clients within delta, and the
    next model is theta + eta_g * sum_i lambda_i Dbar_i of those secure means (scale_decoders).
    "fail" = the node answers that stage with an error, "exit" = its ClientApp process ends (the
    server waits for the stage timeout):

    - round 1: client 3 fails at setup (before sharing keys): left out (flwr 1.42 alone fails
      such a round, see fedhv.flower.secure), rejected, the round averages clients 0-2;
    - round 2: client 1 fails at unmask, after sending its masked vector: the others' shares of its
      seed remove its own mask, the round averages all 4; client 1's input is in the mean, so it
      is listed in ``secure_unmask_lost`` (and logged), not as rejected;
    - round 3: clients 1 and 2 fail at unmask: 2 shares per secret, below the threshold: the round
      is skipped with the reason, the model kept; nothing was aggregated, so both are rejected;
    - round 4: client 3's process exits when asked for its masked vector (after sharing its
      keys): the others' shares of its key remove its pairwise masks, the round averages 0-2.

    ``clipping_range = 0.025`` clips a few update coordinates (|Delta| reaches ~0.08): the
    counter finds exactly those values, the means are of the clipped values. Only round 4 waits
    for the stage timeout, which is generous (10 s, as in ``test_flower_faults.py``) so that a slow but live node on a loaded
    machine is never taken for the lost one. summary.json counts only the clients left out of a
    mean (1 dropped, 3 rejected)."""
    dep, record, exits = secure_deployment
    _fresh(record)
    exits.write_text(json.dumps([{"client": 3, "round": 1, "stage": "setup", "action": "fail"},
                                 {"client": 1, "round": 2, "stage": "unmask", "action": "fail"},
                                 {"client": 1, "round": 3, "stage": "unmask", "action": "fail"},
                                 {"client": 2, "round": 3, "stage": "unmask", "action": "fail"},
                                 {"client": 3, "round": 4, "stage": "collect_masked_vectors", "action": "exit"}]))
    clip = 0.025
    cfg = load_config("multimnist", [*SECURE, 'method="fsmgda"', "rounds=4", "train.clients_per_round=4",
                                     "flower.reconstruction_threshold=3", f"flower.clipping_range={clip}"])
    assert cfg.fsmgda.scale_decoders
    try:
        run = dep.submit(cfg, tmp_path / "dropout", stage_timeout=10.0)
    finally:
        exits.write_text("[]")  # later runs of the module lose no client
    r1, r2, r3, r4 = rounds_of(run)
    assert [x["client"] for x in r1["rejected"]] == [3] and r1["secure_clients"] == [0, 1, 2]
    assert "setup stage" in r1["rejected"][0]["reason"] and "test hook" in r1["rejected"][0]["reason"]
    assert "secure_unmask_lost" not in r1
    assert r2["secure_clients"] == [0, 1, 2, 3] and r2["rejected_clients"] == r2["dropped_clients"] == 0
    assert "rejected" not in r2 and "dropped" not in r2, r2  # client 1 is in the mean: no fault fields
    assert [x["client"] for x in r2["secure_unmask_lost"]] == [1]
    lost = r2["secure_unmask_lost"][0]["reason"]
    assert "unmask stage" in lost and "test hook" in lost, lost
    assert r4["dropped"] == [3] and r4["secure_clients"] == [0, 1, 2] and "secure_unmask_lost" not in r4
    step, m = quantization_step(clip), 2
    for r in (r1, r2, r4):
        info = json.loads((record / f"train-{r['round']}.json").read_text())
        got = dict(np.load(record / f"train-{r['round']}.npz"))
        assert_only_masked_values_arrive(info)
        assert "report" not in got and got["deltas"].shape[0] == m
        updates, _ = client_values(cfg, got["theta"], r["secure_clients"], np.eye(m), r["round"] - 1, report=False)
        err = float(np.abs(got["deltas"] - np.clip(updates, -clip, clip).mean(0)).max())
        assert 0 < err < step + FLOAT_SLACK, (err, step)
        clipped = int((np.abs(updates) > clip).sum())
        assert 0 < clipped < updates.size // 1000 and r["secure_clipped"] == clipped, (clipped, r["secure_clipped"])
    assert r3["skipped"] is True and "secure_clients" not in r3 and "secure_unmask_lost" not in r3, r3
    assert "unmask stage" in r3["secure_halted"] and "reconstruction_threshold = 3" in r3["secure_halted"]
    assert sorted(x["client"] for x in r3["rejected"]) == [1, 2]
    # FSMGDA's step from the secure means; the skipped round kept the model; the run's model is round 4's
    t1, t2, t3, t4 = (dict(np.load(record / f"train-{k}.npz")) for k in (1, 2, 3, 4))
    np.testing.assert_allclose(t2["theta"], t1["theta"] + cfg.lr_global * (np.asarray(r1["weights"]) @ t1["deltas"]),
                               rtol=0, atol=1e-12)
    np.testing.assert_array_equal(t3["theta"], t4["theta"])
    np.testing.assert_allclose(theta_of(run).numpy(),
                               t4["theta"] + cfg.lr_global * (np.asarray(r4["weights"]) @ t4["deltas"]), rtol=0,
                               atol=1e-12)
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["skipped_rounds"], summary["dropped_clients"], summary["rejected_clients"]) == (1, 1, 3)
    logs = "".join(p.read_text() for p in dep.workdir.glob("app-*/serverapp.log"))
    assert "round 2: client 1 lost in the SecAgg+ unmask stage" in logs


@needs_flwr
def test_unregistered_supernode_is_refused(secure_deployment: Secure) -> None:
    """A SuperNode whose key was never registered cannot join: the SuperLink refuses it and it exits.
    Last in the module: the intruder must not be around while the other runs use the deployment."""
    dep = secure_deployment[0]
    key = dep.node_key("intruder")
    node = dep.start_node(0, key, name="supernode-intruder", clientapp=False)
    deadline = time.monotonic() + 60
    while node.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node.returncode not in (None, 0)
    log = (dep.workdir / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in log
    assert log.count("[Fleet.ActivateNode] Activated node_id=") == NODES  # nobody else got in
