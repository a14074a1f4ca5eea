"""Seconds per round on Flower against both simulator engines, measured in one run.

    FEDHV_DATA=... python perf/flower_round.py [--rounds 5] [--nodes 3] [--repeats 1]

One configuration (MultiMNIST full size, ``--nodes`` clients all sampled every round, float32,
FedHV with the paper's reference so no calibration runs) through three paths, one after the
other, ``--repeats`` times alternating: ``fedhv run`` with the batched engine, ``fedhv run`` with
the sequential engine (what each Flower node runs), and ``fedhv flower local`` (the default
``--isolation process`` deployment). Prints each path's ``seconds_per_round`` (from
``summary.json``: the training loop, without start-up) and wall time, and the Flower path's
ratio to each engine. The numbers depend on the machine's load: compare ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(cmd: list[str], out: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    return float(json.loads((out / "summary.json").read_text())["seconds_per_round"]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    sets = ["fedhv.reference=\"paper\"", f"partition.clients={args.nodes}", f"train.clients_per_round={args.nodes}",
            "eval.test_period=0", "eval.final=true"]
    flags = [x for s in sets for x in ("--set", s)]
    base = Path(tempfile.mkdtemp(prefix="fedhv-flower-round-"))
    cli = [sys.executable, "-m", "fedhv.cli"]
    paths = {
        "fedhv run (batched)": lambda out: [*cli, "run", "multimnist", "--rounds", str(args.rounds), *flags,
                                            "--set", 'engine="batched"', "--out", str(out)],
        "fedhv run (sequential)": lambda out: [*cli, "run", "multimnist", "--rounds", str(args.rounds), *flags,
                                               "--set", 'engine="sequential"', "--out", str(out)],
        "fedhv flower local": lambda out: [*cli, "flower", "local", "multimnist", "--nodes", str(args.nodes),
                                           "--rounds", str(args.rounds), *flags, "--out", str(out), "--quiet"],
    }
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
    for rep in range(args.repeats):
        for i, (name, cmd) in enumerate(paths.items()):
            out = base / f"{rep}-{i}"
            got[name].append(run(cmd(out), out))
            print(f"{name}: {got[name][-1][0]:.2f} s per round, {got[name][-1][1]:.0f} s wall", flush=True)
    per_round = {name: statistics.median(r for r, _ in runs) for name, runs in got.items()}
    flower = per_round["fedhv flower local"]
    print("\n| path | s / round | wall | Flower / path |\n|---|---|---|---|")
    for name, runs in got.items():
        print(f"| {name} | {per_round[name]:.2f} | {statistics.median(w for _, w in runs):.0f} s | "
              f"{flower / per_round[name]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
