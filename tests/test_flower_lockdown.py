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

from fedhv.config import load_config
from flower_support import needs_flwr, rounds_of

from conftest import SMALL


def _flwr(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "flwr"), *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@needs_flwr
def test_a_node_host_with_only_the_ca_is_refused_the_control_api(tmp_path: Path) -> None:
    from fedhv.flower.certs import make_node_key
    from fedhv.flower.lifetime import MARK
    from fedhv.flower.local import local_deployment

    with local_deployment(2, tls=True, auth=True, gate=True) as dep:
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
        cfg = load_config("multimnist", [*SMALL, "partition.clients=2", "train.clients_per_round=2", "rounds=1",
                                         'method="uniform"', "eval.test_period=1"])
        run = dep.submit(cfg, tmp_path / "run")  # the nodes work through the gate
    assert len(rounds_of(run)) == 1 and (run / "summary.json").is_file()
