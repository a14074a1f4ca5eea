"""Flower deployment with TLS and SuperNode authentication (real processes, loopback only)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhv.config import load_config
from flower_support import HAVE_FLWR, NODES, checked_deployment

from conftest import SMALL

pytestmark = pytest.mark.skipif(not HAVE_FLWR, reason="the Flower back-end needs flwr: pip install -e '.[test,flower]'")
if HAVE_FLWR:
    from fedhv.flower.local import Deployment, FlowerRunError, local_deployment



@pytest.fixture(scope="module")
def secure(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """SuperLink (TLS, SuperNode auth on) and NODES registered SuperNodes; no process survives it."""
    with checked_deployment(request, NODES, tls=True, auth=True) as dep:
        yield dep


def test_tls_and_node_auth_run_is_complete(secure: Deployment, tmp_path: Path) -> None:
    """FedHV, 2 rounds, over TLS with authenticated SuperNodes: a complete run directory."""
    log = (secure.workdir / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1" in log  # TLS, not plain HTTP
    assert "SuperNode authentication is disabled" not in log
    cfg = load_config("multimnist", [*SMALL, f"partition.clients={NODES}", f"train.clients_per_round={NODES}",
                                     "rounds=2"])
    run = secure.submit(cfg, tmp_path / "run")
    for name in ("config.toml", "environment.json", "calibration.json", "rounds.jsonl", "metrics.jsonl",
                 "summary.json", "model.pt"):
        assert (run / name).is_file(), name
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["dropped_clients"] == r["rejected_clients"] == 0 and len(r["clients"]) == NODES for r in rounds)
    assert json.loads((run / "summary.json").read_text())["rounds"] == 2
    log = (secure.workdir / "superlink.log").read_text()
    assert log.count("[Fleet.ActivateNode] Activated node_id=") == NODES  # each with its registered key


def test_unregistered_supernode_is_refused(secure: Deployment) -> None:
    """A SuperNode whose key was never registered cannot join: the SuperLink refuses it and it exits."""
    key = secure.node_key("intruder")
    node = secure.start_node(0, key, name="supernode-intruder", clientapp=False)
    deadline = time.monotonic() + 60
    while node.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node.returncode not in (None, 0)
    log = (secure.workdir / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in log
    assert log.count("[Fleet.ActivateNode] Activated node_id=") == NODES  # nobody else got in


def test_auth_without_tls_is_a_one_line_error() -> None:
    with pytest.raises(FlowerRunError, match=r"--auth without --tls.*add --tls"), local_deployment(1, auth=True):
        pass
