"""Round time against the number of tasks m: MultiMNIST with m derived tasks, every method.

Usage::

    FEDHV_DATA=../shared/data python perf/task_scaling.py [--tasks 2,5,10] [--rounds R]
        [--methods uniform,fedhv,fsmgda,fedcmoo] [--set k=v ...]

MultiMNIST has two tasks (the left and the right digit). For ``m`` tasks, task ``j`` asks for
digit ``j mod 2`` shifted by ``j // 2`` (label ``(d + j // 2) mod 10``): the same images and
clients, one LeNet encoder, ``m`` heads and ``m`` losses. What a round computes then grows
with ``m`` as it would on real tasks: FedHV reports ``m`` losses, FSMGDA trains ``m``
trajectories per client, FedCMOO sketches an ``m``-column gradient matrix; the heads are a
small part of the FLOPs. Accuracy is not the point (the derived tasks are easy copies).
FedHV runs with the fixed reference ``r_i = 3`` (above every initial loss, ln 10 ≈ 2.30).
One process, the batched engine; each line is the median of ``R`` timed rounds after a
warm-up (:func:`round_time.time_rounds`), with the process's CPU seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch
from round_time import memory_note, time_rounds

from fedhv._malloc import tune_allocator
from fedhv.config import load_config
from fedhv.data.federated import FederatedData
from fedhv.experiment.setup import federated_data


def with_tasks(data: FederatedData, m: int) -> FederatedData:
    """``data`` (two 10-class tasks) with ``m`` derived 10-class tasks (module docstring)."""

    def derive(y: torch.Tensor) -> torch.Tensor:
        return torch.stack([(y[:, j % 2] + j // 2) % 10 for j in range(m)], dim=1)

    return dataclasses.replace(
        data, task_names=tuple(f"task{j}" for j in range(m)), num_classes=(10,) * m, train_y=derive(data.train_y),
        eval_sets={k: (x, derive(y)) for k, (x, y) in data.eval_sets.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="2,5,10")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="uniform,fedhv,fsmgda,fedcmoo")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    tune_allocator()
    cfg = load_config("multimnist", args.overrides)
    base = federated_data(cfg)
    if base.num_classes != (10, 10):
        raise SystemExit("task_scaling.py derives its tasks from MultiMNIST's two 10-class tasks")
    print(f"multimnist, {cfg.train.clients_per_round} clients x {cfg.train.local_steps} steps x batch "
          f"{cfg.train.batch_size}; {torch.get_num_threads()} threads, {cfg.dtype}; load {os.getloadavg()[0]:.2f}")
    print(f"{'m':>3} {'method':<9} {'s/round':>8} {'client':>8} {'server':>8} {'vs m=2':>7} {'CPU s':>7}")
    first: dict[str, float] = {}
    for m in (int(t) for t in args.tasks.split(",")):
        data = with_tasks(base, m)
        for method in args.methods.split(","):
            (total, client, server, cpu), _, _ = time_rounds(cfg, data, method, "batched", args.rounds,
                                                              reference=(3.0,) * m)
            first.setdefault(method, total)
            print(f"{m:>3} {method:<9} {total:8.3f} {client:8.3f} {server:8.3f} {total / first[method]:7.2f} "
                  f"{cpu:7.2f}   {memory_note(cfg.device)}", flush=True)
    print(f"load (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
