"""Time and peak memory of one real-sized CelebA5 FedHV round (random 32x32 data).

A CelebA5 round: 10 of 30 clients, ResNet-18 (GroupNorm) at 32x32, batch 64, K = 5
local steps with momentum 0.9, objective reports over each client's 500 samples.
Payloads and FLOPs do not depend on the pixel values, so random images stand in for
CelebA (which may not be redistributed).

Usage::

    python perf/celeba_round.py [--engine batched|sequential] [--chunk C] [--rounds R]
                                      [--variant fused|vmap] [--precision fp32|bf16] [--profile N]

``--variant vmap`` hides ``ResNet18GN.forward_batched`` so that the batched engine falls
back to ``torch.func.vmap`` (the engine before issue 13), for before/after timings. Each
round prints its wall-clock split into reports and local training, and the run prints
what ``engine_chunk = "auto"`` would choose (:mod:`fedhv.sim.memory`) next to the
measured peak RSS growth of the round.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
from collections.abc import Callable

import numpy as np
import torch

from fedhv._malloc import tune_allocator
from fedhv.algorithms import FedHVAlgorithm
from fedhv.config import load_config
from fedhv.data.federated import FederatedData
from fedhv.models import ResNet18GN, default_init, get_flat
from fedhv.objectives import MultiLabel
from fedhv.paper import REFERENCES
from fedhv.rng import torch_generator
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.engine import SequentialEngine
from fedhv.sim.federation import SimFederation
from fedhv.sim.memory import auto_chunk

GROUPS = tuple(tuple(range(8 * i, 8 * i + 8)) for i in range(5))


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="batched", choices=["batched", "sequential"])
    parser.add_argument("--chunk", type=int, default=0, help="model copies trained at once (0 = all)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variant", default="fused", choices=["fused", "vmap"],
                        help="batched engine's forward: ResNet18GN.forward_batched or torch.func.vmap")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the top N operators (self CPU time) of the last round")
    args = parser.parse_args()
    tune_allocator()
    if args.variant == "vmap":
        ResNet18GN.forward_batched = None  # type: ignore[assignment,method-assign]  # engine falls back to vmap
    g = torch.Generator().manual_seed(0)
    clients, per_client = 30, 500
    n = clients * per_client
    data = FederatedData(
        task_names=tuple(f"T{i + 1}" for i in range(5)),
        num_classes=(8,) * 5,
        train_x=torch.randn(n, 3, 32, 32, generator=g) * 0.25,
        train_y=(torch.rand(n, 40, generator=g) < 0.3).long(),
        parts=torch.randperm(n, generator=g).view(clients, per_client),
        eval_sets={},
        augment=None,
        objective=MultiLabel(GROUPS),
    )
    model = ResNet18GN()
    default_init(model, torch_generator(0, "init"))
    theta = get_flat(model).clone()
    alg = FedHVAlgorithm(np.asarray(REFERENCES["celeba5"]), lr_global=1.0)
    kwargs = {"local_steps": 5, "batch_size": 64, "lr_local": 0.2, "momentum": 0.9, "seed": 0,
              "precision": args.precision, "eval_batch_size": load_config("celeba5-a").eval.batch_size}
    engine = (BatchedEngine(ResNet18GN(), data, chunk=args.chunk, **kwargs) if args.engine == "batched"
              else SequentialEngine(ResNet18GN(), data, **kwargs))
    seconds = {"reports": 0.0, "train": 0.0}
    for name in seconds:
        setattr(engine, name, _timed(getattr(engine, name), seconds, name))
    print(f"CelebA5 round: 10 clients x 5 steps x batch 64 + 500-sample reports, ResNet-18-GN "
          f"(d = {theta.numel():,}), engine {args.engine} ({args.variant}, {args.precision}), "
          f"chunk {args.chunk or 'all'}, {torch.get_num_threads()} threads; RSS before: {peak_rss_gib():.2f} GiB")
    if args.engine == "batched":
        choice = auto_chunk(engine.model, (3, 32, 32), 64, args.precision)
        print(f"{choice.describe()}; estimate for 10 copies at once: {10 * choice.copy_bytes / 2**30:.2f} GiB")
    start_rss = peak_rss_gib()
    state = alg.init_state(5)
    for r in range(args.rounds):
        sampled = np.sort(np.random.default_rng(r).choice(clients, 10, replace=False))
        fed = SimFederation(engine, sampled, r)
        profiler = _profiler() if args.profile and r == args.rounds - 1 else contextlib.nullcontext()
        t0 = time.perf_counter()
        with profiler as prof:
            res = alg.round(state, theta, fed)
        state, theta = res.state, res.theta
        print(f"round {r + 1}: {time.perf_counter() - t0:.1f} s (client {fed.client_seconds:.1f} s: reports "
              f"{seconds['reports']:.1f} s, train {seconds['train']:.1f} s), peak RSS {peak_rss_gib():.2f} GiB "
              f"(+{peak_rss_gib() - start_rss:.2f}), report {np.round(res.log['report'], 4).tolist()}", flush=True)
        seconds.update(reports=0.0, train=0.0)
    if args.profile:
        print(f"\nprofile of round {args.rounds} (top {args.profile} by self CPU time; times include the profiler's "
              "overhead):")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile,
                                        max_name_column_width=40))


def _profiler():  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU])


def _timed(fn: Callable[..., torch.Tensor], seconds: dict[str, float], name: str) -> Callable[..., torch.Tensor]:
    """``fn`` adding its wall-clock seconds to ``seconds[name]``."""
    def wrapper(*args: object, **kwargs: object) -> torch.Tensor:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - t0
    return wrapper


if __name__ == "__main__":
    main()
