"""Issue 29, item 3: node hosts reach the Fleet API only.

flwr 1.42 serves the Fleet, Control and Runtime APIs on one port and has no account
authentication, so a host holding only ``ca.crt`` could register its own SuperNode. In the
documented deployment the node hosts connect through :mod:`fedhv.flower.gate`: a host with only
``ca.crt`` is refused when it tries ``flwr supernode register`` / ``list`` or ``flwr ls`` at the
address the nodes use, the operator's registrations are unchanged, and a run whose SuperNodes
(with SuperNode authentication) connect through the gate completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedhv.config import load_config
from flower_support import needs_flwr, rounds_of

from conftest import SMALL

pytestmark = pytest.mark.needs_data  # every test here reads the real data


def _flwr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "flwr"), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _refused_at_the_gate(dep, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A node host with only ``ca.crt`` and the nodes' address: register / list / ls refused, the
    operator's registrations unchanged."""
    from fedhv.flower.certs import make_node_key
    from fedhv.flower.lifetime import MARK

    ca = dep.root_certificates
    assert ca is not None and dep.fleet_port and dep.fleet_port != dep.port
    home = tmp_path / "node-host"  # what a node host has: ca.crt and the address the nodes use
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "node"\n\n[superlink.node]\n'
                                      f'address = "127.0.0.1:{dep.fleet_port}"\nroot-certificates = "{ca}"\n')
    host_env = {**dep.env, "FLWR_HOME": str(home)}
    host_env.pop(MARK)
    key = make_node_key(tmp_path / "keys", "intruder")[0]
    before = _flwr(dep.env, "supernode", "list", "local", "--format", "json")
    assert before.returncode == 0, before.stdout + before.stderr
    for args in (["supernode", "register", f"{key}.pub", "node", "--format", "json"],
                 ["supernode", "list", "node", "--format", "json"], ["ls", "node", "--format", "json"]):
        res = _flwr(host_env, *args)
        assert res.returncode != 0 or '"success": false' in res.stdout.replace(" ", "").replace(
            '"success":false', '"success": false'), (args, res.stdout, res.stderr)
        assert "node-id" not in res.stdout, res.stdout
    after = _flwr(dep.env, "supernode", "list", "local", "--format", "json")
    ids = [sorted(n["node-id"] for n in json.loads(r.stdout)["nodes"]) for r in (before, after)]
    assert ids[0] == ids[1] and len(ids[0]) == 2  # nothing was registered through the gate


@needs_flwr
def test_gate_refuses_a_node_host_and_the_restart_runbook_resumes_bit_identically(tmp_path: Path) -> None:
    """One deployment (TLS, SuperNode authentication, the gate, ``--database``) for both checks:

    1. a node host with only ``ca.crt`` is refused the Control API at the gate (above);
    2. the recovery runbook (docs/flower.md): a run of the authenticated nodes through the gate,
       the SuperLink killed (kill -9) after round 2 of 4 and started again on its port and
       ``--database``; the registered node keys are still there, the SuperNodes reconnect by
       themselves, and ``resume`` ends with the uninterrupted float64 run's rounds and model,
       bit for bit.
    """
    import os
    import signal
    import threading
    import time

    import torch

    from fedhv.experiment.runner import run_experiment
    from fedhv.flower.control import running_runs
    from fedhv.flower.local import local_deployment
    from flower_support import theta_of

    sets = [*SMALL, "partition.clients=2", "train.clients_per_round=2", "rounds=4", "dtype='float64'",
            'engine="sequential"', "calibration.rounds=1"]
    cfg = load_config("multimnist", sets)
    out = tmp_path / "run"
    with local_deployment(2, tls=True, auth=True, gate=True) as dep:
        _refused_at_the_gate(dep, tmp_path)
        nodes_before = json.loads(_flwr(dep.env, "supernode", "list", "local", "--format", "json").stdout)["nodes"]
        failed: list[BaseException] = []

        def submit() -> None:
            try:
                dep.submit(cfg, out)
            except BaseException as exc:  # noqa: BLE001 - checked in the test thread
                failed.append(exc)

        worker = threading.Thread(target=submit)
        worker.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (not (out / "rounds.jsonl").exists()
                                                or (out / "rounds.jsonl").read_bytes().count(b"\n") < 2):
            time.sleep(0.05)
        link = next(p for name, p in dep.procs if name == "superlink")
        os.kill(link.pid, signal.SIGKILL)
        worker.join(timeout=120)
        assert failed and "superlink" in str(failed[0]), failed
        dep.restart_superlink()
        # the dead ServerApp's run is stopped, so a message it left half-pushed is dropped by the nodes
        assert running_runs(dep.port, dep.root_certificates) == []
        nodes_after = json.loads(_flwr(dep.env, "supernode", "list", "local", "--format", "json").stdout)["nodes"]
        assert sorted(n["node-id"] for n in nodes_after) == sorted(n["node-id"] for n in nodes_before)
        dep.submit(None, resume=out)
    sim = tmp_path / "sim"
    run_experiment(load_config("multimnist", sets), sim, progress=False)
    got, want = rounds_of(out), rounds_of(sim)
    assert [r["clients"] for r in got] == [r["clients"] for r in want] and len(got) == 4
    assert [r["report"] for r in got] == [r["report"] for r in want]
    assert torch.equal(theta_of(out), theta_of(sim))
