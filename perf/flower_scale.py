"""Scale: the Flower App on Flower's Simulation Engine against fedhv's simulator, same N and M.

    FEDHV_DATA=... python perf/flower_scale.py [--nodes 1000,10000] [--per-round 100] [--rounds 3]

For each N in ``--nodes``: MultiMNIST's model and data (``partition.samples_per_client`` 64, so
every client-round costs the same at every N; the partition recycles samples above N = 937),
M = ``--per-round`` clients per round, K = 10 local steps of batch 32, FedHV with the paper's
reference (no calibration), no evaluation before the final one, float32. Three paths, one
after the other on the same machine:

- ``fedhv run`` with the batched engine and with the sequential engine (what each Flower
  node runs);
- ``flwr run flower-app sim`` with ``num-supernodes = N`` virtual SuperNodes (Ray actors,
  ``client-resources-num-cpus = 1``, so one actor per core), the app deriving each node's
  partition from its ``node_config``.

Printed per path: seconds per round (``summary.json``: the round loop, without start-up),
the wall clock of the whole command, the start-up part of it (wall − rounds × s/round:
process start, data, for Flower the node discovery and the handshake, which ask every one
of the N nodes once) and the peak resident memory summed over every process of the path
(sampled every 0.2 s from ``/proc``; Flower's processes are found by their
``FEDHV_DEPLOYMENT`` mark). For Flower also where a round's time goes, from ``rounds.jsonl``:
the round trip of the stage messages (``time_client_s``) against the nodes' own compute
(``node_seconds``, summed over the round's clients and divided by the actors), the rest
being the server's own work. The numbers depend on the machine's load: compare the paths of
one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_kib(pids: list[int]) -> int:
    """Resident memory of ``pids`` summed (KiB; processes that are gone count 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class PeakMemory:
    """Samples the summed RSS of the processes ``find()`` returns every 0.2 s until stopped."""

    def __init__(self, find) -> None:
        self.find, self.peak, self._stop = find, 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, rss_kib(self.find()))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20  # GiB


def tree(root: int) -> list[int]:
    from fedhv.flower.lifetime import descendants

    return [root, *descendants(root)]


def run_path(cmd: list[str], env: dict[str, str], out: Path, token: str | None) -> dict:
    """Run ``cmd``; its seconds per round, wall clock, peak memory and rounds."""
    from fedhv.flower.lifetime import marked, sweep

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mem = PeakMemory((lambda: marked(token)) if token else (lambda: tree(proc.pid)))
    try:
        log, _ = proc.communicate(timeout=6 * 3600)
    finally:
        peak = mem.stop()
        if token:
            sweep(token, grace_s=3.0)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not (out / "summary.json").exists():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
    steady = statistics.median(r["time_client_s"] + r["time_server_s"] for r in rounds[1:] or rounds)
    return {"s_per_round": float(summary["seconds_per_round"]), "steady": steady, "wall": wall, "peak_gib": peak,
            "rounds": rounds}


def sim_env(home: Path, token: str) -> dict[str, str]:
    from fedhv.flower.procs import free_ports

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = ":local:"\n')
    return {**os.environ, "FLWR_HOME": str(home), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_ports(1)[0]),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FEDHV_DEPLOYMENT": token,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,10000", help="comma-separated N")
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actors", type=int, default=os.cpu_count() or 1, help="Simulation Engine actors (cores)")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here")
    parser.add_argument("--discover", action="store_true",
                        help="let the app ask every SuperNode for its partition count (clients=0) instead of clients=N")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fedhv-flower-scale-"))
    results: list[dict] = []
    for n in (int(v) for v in args.nodes.split(",")):
        sets = ["fedhv.reference='paper'", "partition.samples_per_client=64", f"train.clients_per_round={args.per_round}",
                "eval.test_period=0", "eval.final=true"]
        for engine in ("batched", "sequential"):
            out = base / f"n{n}-{engine}"
            cmd = [sys.executable, "-m", "fedhv.cli", "run", "multimnist", "--rounds", str(args.rounds),
                   *[x for s in [*sets, f"partition.clients={n}", f'engine="{engine}"'] for x in ("--set", s)],
                   "--out", str(out), "--quiet"]
            got = run_path(cmd, dict(os.environ), out, None)
            results.append({"n": n, "path": f"fedhv run ({engine})", **got})
            print(f"N={n} fedhv run ({engine}): {got['s_per_round']:.2f} s/round ({got['steady']:.2f} after round 1), wall {got['wall']:.0f} s, "
                  f"peak {got['peak_gib']:.2f} GiB", flush=True)
        token = uuid.uuid4().hex
        out = base / f"n{n}-flower"
        clients = 0 if args.discover else n
        run_config = f'rounds={args.rounds} clients={clients} set="{"; ".join(sets)}" out="{out}" node-wait=3600'
        cmd = [str(Path(sys.executable).parent / "flwr"), "run", str(ROOT / "flower-app"), "sim", "--federation-config",
               f"num-supernodes={n} client-resources-num-cpus={max(1, (os.cpu_count() or 1) // args.actors)}",
               "--run-config", run_config, "--stream"]
        got = run_path(cmd, sim_env(base / f"home-{n}", token), out, token)
        per = got["rounds"][1:] or got["rounds"]  # round 1 also builds each actor's engine
        trip = statistics.median(r["time_client_s"] for r in per)
        node = statistics.median(r.get("node_seconds", float("nan")) for r in per)
        got.update(round_trip=trip, node_seconds=node)
        results.append({"n": n, "path": "flwr run (Simulation Engine)", **got})
        print(f"N={n} Flower Simulation Engine: {got['s_per_round']:.2f} s/round ({got['steady']:.2f} after round 1; round trip {trip:.2f} s, nodes' "
              f"compute {node:.2f} s over {args.per_round} clients), wall {got['wall']:.0f} s, "
              f"peak {got['peak_gib']:.2f} GiB", flush=True)
    print("\n| N | path | s / round (after round 1) | wall (start-up) | peak memory |\n|---|---|---|---|---|")
    for r in results:
        start = r["wall"] - args.rounds * r["s_per_round"]
        print(f"| {r['n']:,} | {r['path']} | {r['s_per_round']:.2f} ({r['steady']:.2f}) | {r['wall']:.0f} s ({start:.0f} s) | "
              f"{r['peak_gib']:.2f} GiB |")
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "rounds"} for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
