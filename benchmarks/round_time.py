"""Round timing: engines (sequential vs batched) and methods, measured in one process.

Usage::

    FEDHV_DATA=../shared/data python benchmarks/round_time.py [SETTING] [--rounds R]
        [--methods fedhv,uniform,fsmgda,fedcmoo] [--set k=v ...]

Part 1 times FedHV rounds with both engines: seconds per round (median of ``R`` timed
rounds after a warm-up), the client-time split into objective reports and local
training, FLOPs per round (``torch.utils.flop_counter`` on the sequential engine:
convolutions and matrix products, forward and backward), achieved GFLOP/s and the
batched/sequential ratio. Part 2 times one round of each method with the batched
engine, split into client and server time, as ratios to Uniform.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from fedhv._malloc import tune_allocator
from fedhv.config import load_config
from fedhv.experiment.methods import build_method
from fedhv.experiment.setup import federated_data, make_engine, new_model, sample_clients
from fedhv.models import get_flat
from fedhv.sim.federation import SimFederation


def time_rounds(cfg, data, method: str, engine_name: str, rounds: int):  # type: ignore[no-untyped-def]
    """Median (total, client, server) seconds of ``rounds`` rounds after one warm-up."""
    run_cfg = dataclasses.replace(cfg, method=method, engine=engine_name, fedhv=dataclasses.replace(
        cfg.fedhv, reference="paper"))
    run_cfg = load_config_like(run_cfg)
    alg = build_method(run_cfg, data).algorithm
    model = new_model(run_cfg, data, 0)
    engine = make_engine(run_cfg, model, data, 0, "bench")
    theta = get_flat(model).clone()
    state = alg.init_state(data.num_tasks)
    samples = []
    for r in range(rounds + 1):
        fed = SimFederation(engine, sample_clients(0, "bench", r, data.num_clients, cfg.train.clients_per_round), r)
        t0 = time.perf_counter()
        res = alg.round(state, theta, fed)
        total = time.perf_counter() - t0
        state = res.state
        if r:
            samples.append((total, fed.client_seconds, total - fed.client_seconds))
    return tuple(statistics.median(s[i] for s in samples) for i in range(3)), engine, alg


def load_config_like(cfg):  # type: ignore[no-untyped-def]
    """Re-resolve method-dependent learning rates after changing ``method``."""
    from fedhv.config.loader import resolve

    train = dataclasses.replace(cfg.train, lr_global=None, lr_local=None)
    return resolve(dataclasses.replace(cfg, train=train))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("setting", nargs="?", default="multimnist")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--methods", default="uniform,fedhv,fsmgda,fedcmoo")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    tuned = tune_allocator()
    cfg = load_config(args.setting, args.overrides)
    data = federated_data(cfg)
    print(
        f"{cfg.setting}: {cfg.train.clients_per_round} clients x {cfg.train.local_steps} steps x batch "
        f"{cfg.train.batch_size}, reports over {cfg.partition.samples_per_client} samples/client; "
        f"{torch.get_num_threads()} threads, dtype {cfg.dtype}, allocator tuned: {tuned}"
    )
    # Part 1: engines.
    flop_cfg = load_config_like(dataclasses.replace(cfg, method="fedhv", engine="sequential"))
    model = new_model(flop_cfg, data, 0)
    engine = make_engine(flop_cfg, model, data, 0, "bench")
    clients = sample_clients(0, "bench", 0, data.num_clients, cfg.train.clients_per_round)
    theta = get_flat(model).clone()
    w = np.full((1, data.num_tasks), 1.0 / data.num_tasks)
    counter = FlopCounterMode(display=False)
    with counter:
        engine.reports(theta, clients, 0, "all")
        engine.train(theta, clients, w, 0)
    flops = counter.get_total_flops()
    print(f"\nFedHV round: {flops / 1e9:.2f} GFLOP")
    print(f"{'engine':<11} {'s/round':>8} {'reports':>8} {'training':>9} {'GFLOP/s':>8}")
    results = {}
    for name in ("sequential", "batched"):
        (total, _, _), eng, _ = time_rounds(cfg, data, "fedhv", name, args.rounds)
        rep = statistics.median(_timed(lambda e=eng: e.reports(theta, clients, 0, "all")) for _ in range(3))
        results[name] = total
        print(f"{name:<11} {total:8.3f} {rep:8.3f} {total - rep:9.3f} {flops / total / 1e9:8.1f}")
    print(f"batched / sequential: {results['sequential'] / results['batched']:.2f}x faster "
          f"(FLOP utilisation {results['sequential'] / results['batched']:.2f}x)")
    # Part 2: methods.
    print(f"\n{'method':<9} {'s/round':>8} {'client':>8} {'server':>8} {'vs uniform':>10}")
    base = None
    for method in args.methods.split(","):
        (total, client, server), _, _ = time_rounds(cfg, data, method, "batched", args.rounds)
        base = base or total
        print(f"{method:<9} {total:8.3f} {client:8.3f} {server:8.3f} {total / base:10.2f}")


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
