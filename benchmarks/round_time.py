"""Time FedHV rounds with the sequential and the batched engine in one process.

Usage::

    FEDHV_DATA=../shared/data python benchmarks/round_time.py [SETTING] [--rounds R] [--set k=v ...]

Prints seconds per round (median of ``R`` timed rounds after one warm-up round),
the split into objective reports and local training, the FLOPs of one round
(counted by ``torch.utils.flop_counter`` on the sequential engine: convolutions and
matrix products, forward and backward) and the achieved GFLOP/s, and the
batched/sequential ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedhv._malloc import tune_allocator
from fedhv.algorithms import FedHV
from fedhv.config import load_config
from fedhv.experiment.setup import federated_data, make_engine, new_model, sample_clients
from fedhv.models import get_flat
from fedhv.paper import REFERENCES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("setting", nargs="?", default="multimnist")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    tuned = tune_allocator()
    cfg = load_config(args.setting, args.overrides)
    data = federated_data(cfg)
    alg = FedHV(np.asarray(REFERENCES[cfg.data.benchmark]), cfg.lr_global)
    state = alg.init_state(data.num_tasks)
    request = alg.request(state)
    print(
        f"{cfg.setting}: {cfg.train.clients_per_round} clients x {cfg.train.local_steps} steps x batch "
        f"{cfg.train.batch_size}, reports over {cfg.partition.samples_per_client} samples/client; "
        f"{torch.get_num_threads()} threads, dtype {cfg.dtype}, allocator tuned: {tuned}"
    )
    results = {}
    flops = 0
    for name in ("sequential", "batched"):
        engine_cfg = load_config(args.setting, [*args.overrides, f"engine='{name}'"])
        model = new_model(engine_cfg, data, 0)
        engine = make_engine(engine_cfg, model, data, 0, "bench")
        theta = get_flat(model).clone()
        clients = sample_clients(0, "bench", 0, data.num_clients, cfg.train.clients_per_round)
        engine.run_clients(theta, clients, request, 0)  # warm-up
        if name == "sequential":
            counter = FlopCounterMode(display=False)
            with counter:
                engine.run_clients(theta, clients, request, 0)
            flops = counter.get_total_flops()
        times, report_times = [], []
        for r in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            engine.run_clients(theta, clients, request, r)
            times.append(time.perf_counter() - t0)
            no_report = type(request)(request.weights, request.send_weights, report=False)
            t1 = time.perf_counter()
            engine.run_clients(theta, clients, no_report, r)
            report_times.append(times[-1] - (time.perf_counter() - t1))
        results[name] = (statistics.median(times), statistics.median(report_times))
    print(f"FLOPs per round: {flops / 1e9:.2f} GFLOP")
    print(f"{'engine':<11} {'s/round':>8} {'reports':>8} {'training':>9} {'GFLOP/s':>8}")
    for name, (sec, rep) in results.items():
        print(f"{name:<11} {sec:8.3f} {rep:8.3f} {sec - rep:9.3f} {flops / sec / 1e9:8.1f}")
    seq, bat = results["sequential"][0], results["batched"][0]
    print(f"batched speed-up over sequential: {seq / bat:.2f}x (FLOP utilisation ratio {seq / bat:.2f})")


if __name__ == "__main__":
    main()
