"""The locked-down multi-machine recipe of docs/flower.md, end to end on 127.0.0.1, with an intruder.

Starts what the recipe starts — a SuperLink on 127.0.0.1 with TLS, SuperNode authentication and a
database, fedhv's Fleet-only gate in front of it, two **stock** ``flower-supernode`` processes
registered by the operator and connecting through the gate — runs the repository's Flower App with
``flwr run`` as the operator (the SuperLink's own address), then tries what an intruder holding only
``ca.crt`` and the nodes' address would: ``flwr ls`` (list runs), ``flwr supernode register`` (a node
of its own) and ``flwr run`` (start a run of its own App). Prints each outcome and checks, from the
operator's side, that the node list and run list are what the operator made them::

    FEDHV_DATA=../shared/data .venv/bin/python scripts/lockdown_recipe.py

Exit status 0 when the operator's run finished and all three intruder attempts were refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ["partition.samples_per_client=64", "train.batch_size=16", "train.local_steps=3", "calibration.rounds=1",
        "data.max_test_samples=300", "eval.test_period=1"]


def flwr(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).parent / "flwr")
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def listing(env: dict[str, str], *args: str) -> dict:
    res = flwr(env, *args, "--format", "json")
    if res.returncode != 0:
        raise SystemExit(f"operator's flwr {' '.join(args)} failed: {res.stdout}{res.stderr}")
    return json.loads(res.stdout)


def main() -> int:
    from fedhv.flower.certs import make_node_key
    from fedhv.flower.lifetime import MARK
    from fedhv.flower.local import local_deployment

    ok = True
    with tempfile.TemporaryDirectory() as tmp_s, \
            local_deployment(2, isolation="subprocess", poll_s=None, tls=True, auth=True, gate=True) as dep:
        tmp = Path(tmp_s)
        stock = all("fedhv.flower" not in " ".join(map(str, p.args)) for name, p in dep.procs if "supernode" in name)
        print(f"SuperLink 127.0.0.1:{dep.port} (TLS, SuperNode auth); gate 127.0.0.1:{dep.fleet_port}; "
              f"2 SuperNodes through the gate, stock flower-supernode: {stock}")
        nodes_before = sorted(n["node-id"] for n in listing(dep.env, "supernode", "list", "local")["nodes"])
        t0 = time.monotonic()
        out = tmp / "run"
        run_config = f'rounds=2 seed=3 set="{"; ".join(SETS)}" out="{out}"'
        res = flwr(dep.env, "run", str(ROOT / "flower-app"), "local", "--run-config", run_config, "--stream",
                   timeout=900)
        log = res.stdout + res.stderr
        finished = res.returncode == 0 and "fedhv: round 2/2" in log and (out / "summary.json").is_file()
        ok &= finished
        print(f"operator's flwr run: exit {res.returncode}, finished: {finished} ({time.monotonic() - t0:.0f} s)")
        if finished:
            summary = json.loads((out / "summary.json").read_text())
            print(f"  final: {json.dumps({k: summary[k] for k in list(summary)[:6]})}")
        runs_before = sorted(r["run-id"] for r in listing(dep.env, "ls", "local").get("runs", []))

        # The intruder: a host with only ca.crt and the address the nodes use (the gate).
        home = tmp / "intruder"
        home.mkdir()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "node"\n\n[superlink.node]\n'
                                          f'address = "127.0.0.1:{dep.fleet_port}"\n'
                                          f'root-certificates = "{dep.root_certificates}"\n')
        env = {k: v for k, v in {**dep.env, "FLWR_HOME": str(home)}.items() if k != MARK}
        key = make_node_key(tmp / "keys", "intruder")[0]
        app = tmp / "intruder-app"  # an App of the intruder's own
        app.mkdir()
        (app / "pyproject.toml").write_text((ROOT / "flower-app" / "pyproject.toml").read_text())
        attempts = {"list runs (flwr ls)": ["ls", "node", "--format", "json"],
                    "register a node (flwr supernode register)": ["supernode", "register", f"{key}.pub", "node",
                                                                  "--format", "json"],
                    "start a run (flwr run)": ["run", str(app), "node", "--format", "json"]}
        for what, args in attempts.items():
            r = flwr(env, *args, timeout=120)
            text = (r.stdout + r.stderr).strip().replace("\n", " ")
            refused = r.returncode != 0 or '"success": false' in r.stdout or '"success":false' in r.stdout
            refused &= "node-id" not in r.stdout and "run-id" not in r.stdout
            ok &= refused
            print(f"intruder, {what}: exit {r.returncode}, refused: {refused} :: {text[:240]}")
        nodes_after = sorted(n["node-id"] for n in listing(dep.env, "supernode", "list", "local")["nodes"])
        runs_after = sorted(r["run-id"] for r in listing(dep.env, "ls", "local").get("runs", []))
        same = nodes_before == nodes_after and runs_before == runs_after and len(nodes_after) == 2
        ok &= same
        print(f"operator's view after the intruder: nodes {len(nodes_after)} unchanged: {nodes_before == nodes_after}"
              f"; runs {len(runs_after)} unchanged: {runs_before == runs_after}")
    print("RECIPE OK" if ok else "RECIPE FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    sys.exit(main())
