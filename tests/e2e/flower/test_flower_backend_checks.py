"""Issue 29, item 4: defects of the Flower back-end found by hand.

- nothing checked that the server and the nodes run the same fedhv version: a node now refuses
  a handshake from a server of another version (or one that does not say its version), naming
  both versions and the fix;
- ``environment.json`` stored the ServerApp's ``--token``: command-line secrets are redacted;
- no progress was shown while FedHV calibrated over Flower: the ServerApp logs each calibration
  round and ``fedhv flower local`` follows them (a ``calibration`` bar);
- a warning named a node's log file in a work directory that was removed when the run then
  succeeded: the work directory is kept (and named) when a process exited during the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flower_support import needs_flwr


@pytest.fixture
def task_identity() -> Iterator[object]:
    """The run / node identity a SuperNode sets before it runs a ClientApp handler (node 7)."""
    from loopback_grid import task_identity as identity  # imports flwr: only where the test runs

    yield from identity(1, 7, 3)


@needs_flwr
@pytest.mark.parametrize("version", ["9.9.9", None])
def test_a_node_refuses_a_server_of_another_fedhv_version(task_identity: object, version: str | None) -> None:
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    import fedhv
    from fedhv.flower.client import hello
    from fedhv.flower.node import NodeError

    record = {"config": "irrelevant"} | ({"fedhv-version": version} if version else {})
    msg = Message(RecordDict({"fedhv.hello": ConfigRecord(record)}), dst_node_id=7, message_type=MessageType.QUERY)
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1}, state=RecordDict(),
                  run_config={})
    with pytest.raises(NodeError, match=rf"this SuperNode runs fedhv {fedhv.__version__} but the server runs fedhv "
                                        rf"{version or 'unknown'}.*install the same fedhv version"):
        hello(msg, ctx)
    assert "fedhv.hello" not in ctx.state.config_records  # nothing was taken from the refused server


def test_the_serverapp_token_is_redacted_from_the_recorded_command_line() -> None:
    from fedhv.experiment.environment import redacted_argv

    argv = ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:1", "--token", "s3cr3t", "--run-once",
            "--token=other"]
    assert redacted_argv(argv) == ["flwr-serverapp", "--serverappio-api-address", "127.0.0.1:1", "--token",
                                   "<redacted>", "--run-once", "--token=<redacted>"]


@pytest.mark.needs_data
@needs_flwr
def test_the_log_a_warning_names_is_kept_when_the_run_then_succeeds(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A SuperNode dies after round 1; the run finishes with the other node (stage timeout). Before,
    the warning named ``supernode-1.log`` in a work directory removed when the run succeeded."""
    from fedhv.config import load_config
    from fedhv.flower.local import run_local

    from conftest import SMALL

    cfg = load_config("multimnist", [*SMALL, "partition.clients=2", "train.clients_per_round=2", "rounds=3",
                                     "calibration.rounds=2", "eval.test_period=3"])  # FedHV: a calibration first
    out = tmp_path / "run"

    def kill_after_round_one(dep: object) -> None:
        def watch() -> None:
            while not (out / "rounds.jsonl").exists() or (out / "rounds.jsonl").read_bytes().count(b"\n") < 1:
                time.sleep(0.05)
            node = next(p for name, p in dep.procs if name == "supernode-1")  # type: ignore[attr-defined]
            os.kill(node.pid, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()

    calibrated: list[tuple[int, int]] = []
    run = run_local(cfg, 2, out, stage_timeout=8.0, on_start=kill_after_round_one,
                    calibration=lambda done, total: calibrated.append((done, total)))
    # the calibration's progress reached the launcher (before, the bar sat at 0 for its whole length)
    assert calibrated and calibrated[-1] == (2, 2) and calibrated == sorted(calibrated), calibrated
    assert json.loads((run / "summary.json").read_text())["rounds"] == 3
    err = capsys.readouterr().err
    named = re.search(r"see (\S+supernode-1\.log)\)", err)
    assert named is not None, err
    assert Path(named.group(1)).is_file()  # the log the warning named is still there
    assert "are kept in" in err
    shutil.rmtree(Path(named.group(1)).parent, ignore_errors=True)


def test_show_config_out_writes_only_a_valid_configuration(tmp_path: Path) -> None:
    """``fedhv show-config multimnist --set partition.clients=3 > run.toml`` failed (20 clients per
    round > 3) and left an empty file; ``--out`` writes the file only when the configuration is
    valid, and the file loads back as the same configuration."""
    import subprocess
    import sys

    from fedhv.config import dumps, load_config, to_dict
    from fedhv.config.loader import config_from_toml_text

    bad, good = tmp_path / "bad.toml", tmp_path / "good.toml"
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "show-config", "multimnist", "--set",
                          "partition.clients=3", "--out", str(bad)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 2 and "clients_per_round" in res.stderr and not bad.exists(), res.stderr
    sets = ["partition.clients=3", "train.clients_per_round=3"]
    res = subprocess.run([sys.executable, "-m", "fedhv.cli", "show-config", "multimnist", *[a for s in sets for a in
                          ("--set", s)], "--out", str(good)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert dumps(to_dict(config_from_toml_text(good.read_text()))) == dumps(to_dict(load_config("multimnist", sets)))


def test_one_client_per_node_validates_the_overrides_with_the_nodes_count() -> None:
    """Found measuring item 5: 100 clients per round on 1,000 SuperNodes was refused because the
    overrides were first validated against the preset's 30 clients."""
    from fedhv.flower.procs import FlowerRunError
    from fedhv.flower.runconf import local_config

    cfg = local_config("multimnist", 1000, ["train.clients_per_round=100"])
    assert (cfg.partition.clients, cfg.train.clients_per_round) == (1000, 100)
    cfg = local_config("multimnist", 3)  # the preset's 20 per round, lowered to the 3 nodes
    assert (cfg.partition.clients, cfg.train.clients_per_round) == (3, 3)
    with pytest.raises(FlowerRunError, match="--nodes 0"):
        local_config("multimnist", 0)


@pytest.mark.needs_data
def test_a_process_serving_many_virtual_nodes_keeps_small_bounded_client_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found measuring item 5: at 10,000 virtual SuperNodes one Simulation Engine actor grew to
    14 GB (every client's data carried a full [N, S] partition copy, and every client was kept)."""
    from fedhv.config import load_config
    from fedhv.flower import node

    monkeypatch.setattr(node, "MAX_CLIENTS", 8)
    node._DATA.clear()
    cfg = load_config("multimnist", ["partition.clients=500", "partition.samples_per_client=16", "train.batch_size=8",
                                     "train.clients_per_round=10", "data.max_test_samples=100"])
    first = node.partition_data(cfg, 499)
    assert first.parts.shape == (500, 16) and first.parts[499].tolist() == list(range(16))
    assert first.parts.reshape(-1).numel() == 16  # the node's row only, not 500 x 16
    with pytest.raises(node.NodeError, match="holds client 499's samples only"):
        first.parts[0]
    full = node.federated_data(cfg)
    assert torch.equal(first.train_x, full.train_x[full.parts[499]])  # the client's own samples, in order
    for client in range(12):
        node.partition_data(cfg, client)
    assert len(node._DATA["clients"]) == 8 and 499 not in node._DATA["clients"]  # least recently served went
    node._DATA.clear()
