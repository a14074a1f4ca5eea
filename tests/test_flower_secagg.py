"""Secure aggregation (SecAgg+) on Flower: real SuperLink, SuperNodes and ClientApp processes on
127.0.0.1, flwr 1.42's ``SecAggPlusWorkflow`` and ``secaggplus_mod`` (:mod:`fedhv.flower.secure`).

- FedHV (with its Uniform calibration), 3 rounds, float64: in every round the securely
  averaged update and report equal the plain average of the same clients at the same model
  (the simulator's sequential engine, i.e. what the nodes compute) within the quantization
  step ``delta = 2c / 2**22`` (stochastic rounding: each client's error is below one step,
  so is the mean's), and nothing that reaches the server holds a client's report or update;
- a client lost between SecAgg+ stages is recovered from the others' key shares (the round
  aggregates the rest); a client lost before sharing keys is left out; below the
  reconstruction threshold the round is skipped with its reason, the run goes on;
- SuperNodes started for secure runs refuse plain (unmasked) stages;
- secure mode refuses what it cannot mask (FedCMOO, median norm bounds, one client per round).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhv.config import load_config
from fedhv.config.schema import RunConfig
from fedhv.errors import ConfigError
from flower_support import HAVE_FLWR, checked_deployment, needs_flwr, rounds_of, theta_of

from conftest import SMALL

if HAVE_FLWR:
    from fedhv.flower.local import Deployment
    from fedhv.flower.secure import RECORD_ENV, quantization_step
    from fedhv.flower.secure_client import EXIT_ENV

NODES = 4
SECURE = [*SMALL, f"partition.clients={NODES}", "train.clients_per_round=3", 'dtype="float64"', 'engine="sequential"',
          "flower.secure_aggregation=true", "calibration.rounds=1", "eval.test_period=3", "seed=2"]
FLOAT_SLACK = 1e-12  # float64 rounding of flwr's dequantize, far below one quantization step


@pytest.fixture(scope="module")
def secure_deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                      ) -> Iterator[tuple[Any, Path, Path]]:
    """4 SuperNodes that answer only SecAgg+ stages; the ServerApp records what reaches it
    (``RECORD_ENV``), the ClientApps exit where ``EXIT_ENV``'s file says (empty: never)."""
    folder = tmp_path_factory.mktemp("secagg")
    record, exits = folder / "record", folder / "exits.json"
    record.mkdir()
    exits.write_text("[]")
    saved = {k: os.environ.get(k) for k in (RECORD_ENV, EXIT_ENV)}
    os.environ[RECORD_ENV], os.environ[EXIT_ENV] = str(record), str(exits)
    try:
        with checked_deployment(request, NODES, secure=True) as dep:
            yield dep, record, exits
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_ENGINES: dict[str, Any] = {}


def client_values(cfg: RunConfig, theta: np.ndarray, clients: list[int], rows: np.ndarray, round_idx: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each client's plain update ``[k, T, d]`` and report ``[k, m]`` at ``theta``: the simulator's
    sequential engine, which computes what the nodes compute (``tests/test_flower.py``)."""
    from fedhv.config import dumps, to_dict
    from fedhv.experiment.setup import federated_data, new_model
    from fedhv.sim.engine import SequentialEngine

    key = dumps(to_dict(cfg))
    if key not in _ENGINES:
        data = federated_data(cfg)
        t = cfg.train
        _ENGINES[key] = SequentialEngine(new_model(cfg, data, cfg.seed), data, local_steps=t.local_steps,
                                         batch_size=t.batch_size, lr_local=cfg.lr_local, momentum=t.momentum,
                                         seed=cfg.seed, stream="train")
    e, th, ks = _ENGINES[key], torch.from_numpy(theta), np.asarray(clients)
    return e.train(th, ks, rows, round_idx).numpy(), e.reports(th, ks, round_idx, cfg.fedhv.report_batches).numpy()


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


@needs_flwr
def test_secure_fedhv_equals_the_plain_average_within_the_quantization_step(
        secure_deployment: tuple[Deployment, Path, Path], tmp_path: Path) -> None:
    """FedHV with its Uniform calibration round, 3 training rounds (3 of 4 clients each), float64:
    per round and coordinate |secure mean - plain mean| < delta = 2c / 2**22 for the update and the
    report, FedHV's logged report is the secure mean and its next model uses the secure mean update;
    the server's replies and the strategy's results hold no client's values."""
    dep, record, _ = secure_deployment
    cfg = load_config("multimnist", [*SECURE, "rounds=3"])
    run = dep.submit(cfg, tmp_path / "secure")
    clip = cfg.flower.clipping_range
    step = quantization_step(clip)
    assert step == 2 * clip / 2**22
    records = rounds_of(run)
    assert [r["round"] for r in records] == [1, 2, 3] and not any(r.get("skipped") for r in records)
    assert len({tuple(r["clients"]) for r in records}) > 1  # 3 of 4 sampled: sampling is exercised
    calibration = json.loads((record / "calibration-1.json").read_text())
    assert calibration["extras"]["secure_clipped"] == 0 and len(calibration["extras"]["secure_clients"]) == 3
    assert_only_masked_values_arrive(calibration)
    errors = []
    for r in records:
        t = r["round"] - 1
        info = json.loads((record / f"train-{r['round']}.json").read_text())
        got = dict(np.load(record / f"train-{r['round']}.npz"))
        assert_only_masked_values_arrive(info)
        assert r["secure_clients"] == r["clients"] and r["secure_clipped"] == 0 and r["sync_stages"] == 4
        updates, reports = client_values(cfg, got["theta"], r["clients"], np.asarray(r["weights"])[None, :], t)
        assert np.abs(updates).max() < clip and np.abs(reports).max() < clip  # nothing clipped
        # the bound: |secure mean - plain mean| < delta per coordinate (stochastic rounding, see secure.py)
        err_d = float(np.abs(got["deltas"] - updates.mean(0)).max())
        err_r = float(np.abs(got["report"] - reports.mean(0)).max())
        assert err_d < step + FLOAT_SLACK and err_r < step + FLOAT_SLACK, (err_d, err_r, step)
        errors += [err_d, err_r]
        np.testing.assert_allclose(r["report"], got["report"], rtol=0, atol=0)  # FedHV used the secure mean
        assert_reports_are_masked(got, info, reports, r["clients"], clip)
        if r["round"] < 3:  # the next round's model is theta + eta_g * the secure mean update
            nxt = np.load(record / f"train-{r['round'] + 1}.npz")["theta"]
            np.testing.assert_allclose(nxt, got["theta"] + cfg.lr_global * got["deltas"][0], rtol=0, atol=1e-15)
    assert max(errors) > 0  # the values really went through quantization
    assert theta_of(run).dtype == torch.float64


@needs_flwr
def test_clients_lost_between_stages_are_recovered_and_below_threshold_the_round_is_skipped(
        secure_deployment: tuple[Deployment, Path, Path], tmp_path: Path) -> None:
    """4 clients per round, reconstruction_threshold = 3; "fail" = the node answers that stage with
    an error, "exit" = its ClientApp process ends (the server waits for the stage timeout):

    - round 1: client 3 fails at setup (before sharing keys): left out (flwr 1.42 alone fails
      such a round, see fedhv.flower.secure), the round averages clients 0-2;
    - round 2: client 1 fails at unmask, after sending its masked vector: the others' shares of its
      seed remove its own mask, the round averages all 4;
    - round 3: clients 1 and 2 fail at unmask: 2 shares per secret, below the threshold: the round
      is skipped with the reason, the model kept;
    - round 4: client 3's process exits when asked for its masked vector (after sharing its
      keys): the others' shares of its key remove its pairwise masks, the round averages 0-2.

    ``clipping_range = 2`` clips the reports (~2.3): the counter finds exactly those values. Only
    round 4 waits for the stage timeout, which is generous (15 s) so that a slow but live node on a
    loaded machine is never taken for the lost one."""
    dep, record, exits = secure_deployment
    exits.write_text(json.dumps([{"client": 3, "round": 1, "stage": "setup", "action": "fail"},
                                 {"client": 1, "round": 2, "stage": "unmask", "action": "fail"},
                                 {"client": 1, "round": 3, "stage": "unmask", "action": "fail"},
                                 {"client": 2, "round": 3, "stage": "unmask", "action": "fail"},
                                 {"client": 3, "round": 4, "stage": "collect_masked_vectors", "action": "exit"}]))
    cfg = load_config("multimnist", [*SECURE, "rounds=4", "train.clients_per_round=4", 'fedhv.reference="paper"',
                                     "flower.reconstruction_threshold=3", "flower.clipping_range=2.0"])
    run = dep.submit(cfg, tmp_path / "dropout", stage_timeout=15.0)
    r1, r2, r3, r4 = rounds_of(run)
    assert [x["client"] for x in r1["rejected"]] == [3] and r1["secure_clients"] == [0, 1, 2]
    assert "setup stage" in r1["rejected"][0]["reason"] and "test hook" in r1["rejected"][0]["reason"]
    assert [x["client"] for x in r2["rejected"]] == [1] and r2["secure_clients"] == [0, 1, 2, 3]
    assert r4["dropped"] == [3] and r4["secure_clients"] == [0, 1, 2]
    step = quantization_step(2.0)
    for r in (r1, r2, r4):
        got = dict(np.load(record / f"train-{r['round']}.npz"))
        clients = r["secure_clients"]
        updates, reports = client_values(cfg, got["theta"], clients, np.asarray(r["weights"])[None, :],
                                         r["round"] - 1)
        assert float(np.abs(got["deltas"] - np.clip(updates, -2, 2).mean(0)).max()) < step + FLOAT_SLACK
        assert float(np.abs(got["report"] - np.clip(reports, -2, 2).mean(0)).max()) < step + FLOAT_SLACK
        clipped = int((np.abs(updates) > 2).sum() + (np.abs(reports) > 2).sum())
        assert clipped > 0 and r["secure_clipped"] == clipped
    assert r3["skipped"] is True and "secure_clients" not in r3, r3
    assert "unmask stage" in r3["secure_halted"] and "reconstruction_threshold = 3" in r3["secure_halted"]
    assert sorted(x["client"] for x in r3["rejected"]) == [1, 2]
    # the skipped round kept the model; the run's model is round 4's result
    t3, t4 = (np.load(record / f"train-{k}.npz")["theta"] for k in (3, 4))
    np.testing.assert_array_equal(t3, t4)
    got = dict(np.load(record / "train-4.npz"))
    np.testing.assert_allclose(theta_of(run).numpy(), got["theta"] + cfg.lr_global * got["deltas"][0], rtol=0,
                               atol=1e-15)
    assert json.loads((run / "summary.json").read_text())["skipped_rounds"] == 1


def test_secure_mode_refuses_what_it_cannot_mask() -> None:
    base = ["flower.secure_aggregation=true"]
    for extra, pattern in (
        (['method="fedcmoo"'], "method = 'fedcmoo': FedCMOO's gradient stage needs every client's own gradients"),
        (["validation.max_update_norm_ratio=3"], "validation.max_update_norm_ratio = 3.0 with flower.secure"),
        (["train.clients_per_round=1"], "train.clients_per_round = 1 with flower.secure_aggregation = true"),
        (["flower.num_shares=2"], "flower.num_shares = 2: an integer must be between 3"),
        (["flower.reconstruction_threshold=1.5"], r"flower.reconstruction_threshold = 1.5: a fraction"),
        (["flower.clipping_range=0"], "flower.clipping_range = 0.0 must be a positive number"),
    ):
        with pytest.raises(ConfigError, match=pattern):
            load_config("multimnist", [*base, *extra])
    load_config("multimnist", ['method="fedcmoo"'])  # not secure: fine


@needs_flwr
def test_secure_nodes_refuse_plain_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SuperNode started for secure runs (``--node-config secure-aggregation=true``) answers a plain
    stage message with an error, before computing anything: it never sends an unmasked reply."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedhv.flower.client import stage
    from fedhv.flower.node import NodeError

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # as a ServerApp process sets them
        monkeypatch.setattr(TaskIdentity, name, value)
    msg = Message(RecordDict({"fedhv.stage": ConfigRecord({"round": 0})}), dst_node_id=1,
                  message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2,
                                                        "secure-aggregation": True},
                      state=RecordDict(), run_config={})
    with pytest.raises(NodeError, match="secure-aggregation=true and answers only SecAgg\\+ stages"):
        stage(msg, context)


@needs_flwr
def test_secure_cli_refuses_fedcmoo_with_one_line(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "flower", "local", "multimnist", "--nodes", "2",
                          "--secure", "--method", "fedcmoo"], capture_output=True, text=True, timeout=120, check=False,
                         cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith(
        "error: flower.secure_aggregation = true with method = 'fedcmoo'")
