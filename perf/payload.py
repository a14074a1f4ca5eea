"""Per-client payloads of the four methods for the CIFAR10-MNIST model (paper Table 13).

One round of each method on random data with the CIFAR10-MNIST CNN (payloads do not
depend on the data, the number of clients or K). Prints bytes down / up per
participating client per round, synchronization stages, and the ratio of the uplink
to the model-update size.

Usage::

    python perf/payload.py
"""

from __future__ import annotations

import numpy as np
import torch

from fedhv.algorithms import FedHVAlgorithm, UniformAlgorithm
from fedhv.algorithms.fedcmoo import FedCMOOAlgorithm, FedCMOOConfig
from fedhv.algorithms.fsmgda import FSMGDAAlgorithm
from fedhv.data.federated import FederatedData
from fedhv.models import CifarCNN, ParamLayout, default_init, get_flat
from fedhv.models.params import TaskSlices
from fedhv.paper import REFERENCES
from fedhv.rng import torch_generator
from fedhv.sim.batched import BatchedEngine
from fedhv.sim.federation import SimFederation


def main() -> None:
    g = torch.Generator().manual_seed(0)
    clients, per_client, m = 2, 16, 2
    n = clients * per_client
    data = FederatedData(
        task_names=("cifar", "mnist"),
        num_classes=(10, 10),
        train_x=torch.randn(n, 3, 32, 32, generator=g),
        train_y=torch.randint(0, 10, (n, m), generator=g),
        parts=torch.arange(n).view(clients, per_client),
        eval_sets={},
        rotation_degrees=None,
    )
    model = CifarCNN((10, 10))
    default_init(model, torch_generator(0, "init"))
    layout = ParamLayout.of(model)
    slices = TaskSlices.of(layout, m)
    theta = get_flat(model).clone()
    d = theta.numel()
    methods = {
        "uniform": UniformAlgorithm(1.2),
        "fsmgda": FSMGDAAlgorithm(slices, 1.6),
        "fedcmoo": FedCMOOAlgorithm(slices, 1.6),
        "fedcmoo (randsvd-direct)": FedCMOOAlgorithm(slices, 1.6, config=FedCMOOConfig(estimator="randsvd-direct")),
        "fedhv": FedHVAlgorithm(np.asarray(REFERENCES["cifar10-mnist"]), 1.6),
    }
    model_bytes = d * 4
    print(f"CIFAR10-MNIST CNN: d = {d:,} parameters ({len(slices.encoder):,} encoder), model = {model_bytes:,} bytes "
          f"({model_bytes / 1e6:.2f} MB)")
    print(f"{'method':<26} {'down B':>11} {'up B':>11} {'down MB':>8} {'up MB':>8} {'up/model':>8} {'stages':>6}")
    for name, alg in methods.items():
        engine = BatchedEngine(CifarCNN((10, 10)), data, local_steps=1, batch_size=8, lr_local=0.1, momentum=0.0,
                               seed=0)
        fed = SimFederation(engine, np.arange(clients), 0)
        alg.round(alg.init_state(m), theta, fed)
        print(f"{name:<26} {fed.bytes_down:>11,} {fed.bytes_up:>11,} {fed.bytes_down / 1e6:8.3f} "
              f"{fed.bytes_up / 1e6:8.3f} {fed.bytes_up / model_bytes:8.3f} {fed.stages:>6}")


if __name__ == "__main__":
    main()
