"""Cross-device scale of the simulator: seconds per round against the population N and the clients per round M.

    FEDHV_DATA=... python perf/scale.py [--clients 1000,10000,100000] [--per-round 10,100,1000]
                                              [--methods uniform,fedhv] [--rounds 3] [--json FILE]

The multimnist-xd preset (LeNet, log-normal client sizes of mean 24, K = 10, batch 32) with
``partition.clients = N``, ``train.clients_per_round = M`` and FedHV's reference from the paper's
Table 6 (no calibration is timed). Each N runs in its own process (its peak RSS is that process's):
building the federation (loading the data and partitioning it into N clients) is timed once, then
for every M and method one warm-up round and ``--rounds`` timed rounds of the real round loop
(:func:`fedhv.experiment.loop.run_rounds`: client sampling, the engine, the server step and the
round's record). A round's wall time is split into training (the clients' work), server (the
method's aggregation and weights) and everything else (sampling, bookkeeping). Prints a table
with a row per N and the detail per (N, M, method); the numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from typing import Any


def child(n: int, per_round: list[int], methods: list[str], rounds: int) -> dict[str, Any]:
    """Time one population size N in this process."""
    import torch

    from fedhv._malloc import tune_allocator
    from fedhv.config import load_config
    from fedhv.experiment.loop import run_rounds
    from fedhv.experiment.method_setup import build_method
    from fedhv.experiment.setup import federated_data, make_engine, new_model
    from fedhv.models import get_flat

    tune_allocator()
    base = [f"partition.clients={n}", "fedhv.reference='paper'"]
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the recycling note: 10^5 clients x 24 samples share 48,000 pairs
        warnings.simplefilter("ignore")
        data = federated_data(load_config("multimnist-xd", [*base, f"train.clients_per_round={min(per_round)}"]))
    build = time.perf_counter() - t0
    cells = []
    for m in per_round:
        for method in methods:
            cfg = load_config("multimnist-xd", [*base, f"train.clients_per_round={m}", f"method='{method}'"])
            setup = build_method(cfg, data)
            model = new_model(cfg, data, cfg.seed)
            engine = make_engine(cfg, model, data, cfg.seed, "bench")
            times: list[tuple[float, float, float]] = []
            last = [time.perf_counter()]

            def on_round(rec: Any, theta: torch.Tensor, state: Any, last: list[float] = last,
                         times: list[tuple[float, float, float]] = times) -> None:
                now = time.perf_counter()
                times.append((now - last[0], rec.time_client_s, rec.time_server_s))
                last[0] = now

            run_rounds(setup.algorithm, engine, data, get_flat(model).clone(), rounds + 1, m, cfg.seed, "bench",
                       on_round)
            timed = times[1:]
            wall = sum(t[0] for t in timed) / len(timed)
            train = sum(t[1] for t in timed) / len(timed)
            server = sum(t[2] for t in timed) / len(timed)
            cells.append({"clients_per_round": m, "method": method, "round_s": wall, "train_s": train,
                          "server_s": server, "other_s": wall - train - server})
            print(f"N = {n}, M = {m}, {method}: {wall:.3f} s per round", file=sys.stderr, flush=True)
    return {"clients": n, "build_s": build, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "threads": torch.get_num_threads(), "cells": cells}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1000,10000,100000")
    parser.add_argument("--per-round", default="10,100,1000")
    parser.add_argument("--methods", default="uniform,fedhv")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the measurements to this file")
    parser.add_argument("--from-json", nargs="+", metavar="FILE", help="print the tables of saved --json results")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    per_round = [int(v) for v in args.per_round.split(",")]
    methods = args.methods.split(",")
    if args.child is not None:
        print(json.dumps(child(args.child, per_round, methods, args.rounds)))
        return 0
    results: list[dict[str, Any]] = []
    if args.from_json:
        for name in args.from_json:
            with open(name) as fh:
                results += json.load(fh)
        render(sorted(results, key=lambda r: r["clients"]), per_round, methods)
        return 0
    for n in (int(v) for v in args.clients.split(",")):
        ms = [m for m in per_round if m <= n]
        res = subprocess.run([sys.executable, __file__, "--child", str(n), "--per-round", ",".join(map(str, ms)),
                              "--methods", args.methods, "--rounds", str(args.rounds)],
                             stdout=subprocess.PIPE, text=True, check=True)
        results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    render(results, per_round, methods)
    if args.json:
        from fedhv import safe_io

        safe_io.write_json(args.json, results)
    return 0


def render(results: list[dict[str, Any]], per_round: list[int], methods: list[str]) -> None:
    """The table with a row per N, then the split of every (N, M, method)."""
    head = " | ".join(f"M = {m} {meth}" for m in per_round for meth in methods)
    print(f"\n| N | build (s) | peak RSS (GiB) | {head} |")
    print("|---" * (3 + len(per_round) * len(methods)) + "|")
    for r in results:
        got = {(c["clients_per_round"], c["method"]): c for c in r["cells"]}
        row = " | ".join(f"{got[(m, meth)]['round_s']:.3f}" if (m, meth) in got else "–"
                         for m in per_round for meth in methods)
        print(f"| {r['clients']:,} | {r['build_s']:.1f} | {r['peak_rss_gib']:.2f} | {row} |")
    print("\ns per round: training / server / everything else")
    print("\n| N | M | method | round (s) | training | server | other |\n|---|---|---|---|---|---|---|")
    for r in results:
        for c in r["cells"]:
            print(f"| {r['clients']:,} | {c['clients_per_round']} | {c['method']} | {c['round_s']:.3f} | "
                  f"{c['train_s']:.3f} | {c['server_s']:.4f} | {c['other_s']:.4f} |")


if __name__ == "__main__":
    raise SystemExit(main())
