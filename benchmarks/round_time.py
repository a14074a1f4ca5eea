"""Round timing: engines (sequential vs batched) and methods, measured in one process.

Usage::

    FEDHV_DATA=../shared/data python benchmarks/round_time.py [SETTING] [--rounds R]
        [--methods fedhv,uniform,fsmgda,fedcmoo] [--set k=v ...] [--no-sequential] [--profile N]

Part 1 times FedHV rounds with both engines: seconds per round (median of ``R`` timed
rounds after a warm-up), the client-time split into objective reports and local
training, FLOPs per round (``torch.utils.flop_counter`` on the sequential engine:
convolutions and matrix products, forward and backward), achieved GFLOP/s and the
batched/sequential ratio. Part 2 times one round of each method with the batched
engine, split into client and server time, as ratios to Uniform.

Every timing line ends with the process's peak RSS so far (``getrusage`` ``ru_maxrss``;
monotone, so a line's value bounds everything measured up to it) and, on CUDA, the peak
device memory of that measurement (``torch.cuda.max_memory_allocated``, reset before it).
With ``--set precision=bf16`` Part 1 also times the batched fp32 FedHV round and prints the
bf16 / fp32 ratio. ``--profile N`` prints the top ``N`` operators (self CPU time) of one
batched FedHV round under ``torch.profiler``. ``--no-sequential`` skips the sequential
engine (e.g. for the scaling runs over ``train.clients_per_round``).
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
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


def memory_note(device: str) -> str:
    """Peak RSS so far (and the CUDA peak since the last reset), for the end of a timing line."""
    note = f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    if device.startswith("cuda"):
        note += f", CUDA peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
        torch.cuda.reset_peak_memory_stats()
    return note


def time_rounds(cfg, data, method: str, engine_name: str, rounds: int):  # type: ignore[no-untyped-def]
    """Median (total, client, server, CPU) seconds of ``rounds`` rounds after one warm-up.

    CPU is the process's CPU time (``time.process_time``: all threads, user + system); on a
    shared, loaded machine it moves far less with the load than the wall time does.
    """
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
        t0, c0 = time.perf_counter(), time.process_time()
        res = alg.round(state, theta, fed)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        state = res.state
        if r:
            samples.append((total, fed.client_seconds, total - fed.client_seconds, cpu))
    return tuple(statistics.median(s[i] for s in samples) for i in range(4)), engine, alg


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
    parser.add_argument("--no-sequential", action="store_true", help="time only the batched engine in Part 1")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the top N operators of one batched FedHV round")
    args = parser.parse_args()
    tuned = tune_allocator()
    cfg = load_config(args.setting, args.overrides)
    data = federated_data(cfg)
    print(
        f"{cfg.setting}: {cfg.train.clients_per_round} clients x {cfg.train.local_steps} steps x batch "
        f"{cfg.train.batch_size}, reports over {cfg.partition.samples_per_client} samples/client; "
        f"{torch.get_num_threads()} threads, dtype {cfg.dtype}, precision {cfg.precision}, "
        f"engine_chunk {cfg.engine_chunk}, allocator tuned: {tuned}; {memory_note(cfg.device)} after loading"
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
    print(f"{'engine':<11} {'s/round':>8} {'reports':>8} {'training':>9} {'GFLOP/s':>8} {'CPU s':>7}")
    results = {}
    for name in ("batched",) if args.no_sequential else ("sequential", "batched"):
        (total, _, _, cpu), eng, _ = time_rounds(cfg, data, "fedhv", name, args.rounds)
        rep = statistics.median(_timed(lambda e=eng: e.reports(theta, clients, 0, "all")) for _ in range(3))
        results[name] = total
        chunk = getattr(eng, "chunk_choice", None)
        print(f"{name:<11} {total:8.3f} {rep:8.3f} {total - rep:9.3f} {flops / total / 1e9:8.1f} {cpu:7.2f}   "
              f"{memory_note(cfg.device)}" + (f"; {chunk.describe()}" if chunk else ""))
    if "sequential" in results:
        print(f"batched / sequential: {results['sequential'] / results['batched']:.2f}x faster "
              f"(FLOP utilisation {results['sequential'] / results['batched']:.2f}x)")
    if cfg.precision != "fp32":
        fp32 = dataclasses.replace(cfg, precision="fp32")
        (total, _, _, cpu32), _, _ = time_rounds(fp32, data, "fedhv", "batched", args.rounds)
        print(f"{'batched fp32':<11} {total:8.3f} {'':8} {'':9} {flops / total / 1e9:8.1f} {cpu32:7.2f}   "
              f"{memory_note(cfg.device)}")
        print(f"{cfg.precision} / fp32 round time (batched FedHV): {results['batched'] / total:.2f} wall, "
              f"{cpu / cpu32:.2f} CPU")
    if args.profile:
        profile_round(cfg, data, args.profile)
    # Part 2: methods.
    print(f"\n{'method':<9} {'s/round':>8} {'client':>8} {'server':>8} {'vs uniform':>10} {'CPU s':>7}")
    base = None
    for method in args.methods.split(","):
        (total, client, server, cpu), _, _ = time_rounds(cfg, data, method, "batched", args.rounds)
        base = base or total
        print(f"{method:<9} {total:8.3f} {client:8.3f} {server:8.3f} {total / base:10.2f} {cpu:7.2f}   "
              f"{memory_note(cfg.device)}")


def profile_round(cfg, data, top: int) -> None:  # type: ignore[no-untyped-def]
    """Top ``top`` operators by self CPU time of one batched FedHV round (after a warm-up round)."""
    from torch.profiler import ProfilerActivity, profile

    run_cfg = load_config_like(dataclasses.replace(cfg, method="fedhv", engine="batched",
                                                   fedhv=dataclasses.replace(cfg.fedhv, reference="paper")))
    alg = build_method(run_cfg, data).algorithm
    model = new_model(run_cfg, data, 0)
    engine = make_engine(run_cfg, model, data, 0, "bench")
    theta, state = get_flat(model).clone(), alg.init_state(data.num_tasks)
    clients = sample_clients(0, "bench", 0, data.num_clients, cfg.train.clients_per_round)
    alg.round(state, theta, SimFederation(engine, clients, 0))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        alg.round(state, theta, SimFederation(engine, clients, 1))
    print(f"\nprofile of one batched FedHV round (top {top} by self CPU time):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40))


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
