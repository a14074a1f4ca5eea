"""The ClientApp: the report at the received model, then K local SGD steps on Σ wᵢ ℓᵢ (paper §3.3).

Node ``partition-id`` of ``num-partitions`` loads its client with Flower Datasets (``dataset.py``).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedhv.experiment.grid_ray import keep_local_ray_on_loopback
from fedhv.flower.strategy import fedhv_reply, task_weights
from fedhv_baseline.dataset import load_partition
from fedhv_baseline.model import Net, task_losses
from fedhv_baseline.strategy import TASKS

# `flwr run .` (the Simulation Engine) loads this module, then starts Ray, which listens on every interface by
# default and has no authentication: keep it on 127.0.0.1 (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, as fedhv's grid)
keep_local_ray_on_loopback()

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    rc, nc = context.run_config, context.node_config
    k, n = int(nc["partition-id"]), int(nc["num-partitions"])
    x, y = load_partition(k, n, str(rc["data-dir"]), int(rc["samples-per-client"]), float(rc["alpha"]),
                          int(rc["partition-seed"]))
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    model.eval()  # the report: the task losses over the client's data at the received model
    with torch.no_grad():
        report = [float(v) for v in task_losses(model, x, y)]
    weights = task_weights(msg, TASKS)
    server_round = int(msg.content["config"]["server-round"])
    seed = int(rc["seed"]) * 1_000_003 + server_round * 1000 + k  # this client's batches and dropout this round
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=float(rc["lr-local"]))
    batch = int(rc["batch-size"])
    for _ in range(int(rc["local-steps"])):
        rows = torch.randperm(len(x), generator=g)[:batch]
        losses = task_losses(model, x[rows], y[rows])
        loss = sum(w * ell for w, ell in zip(weights, losses))
        opt.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        opt.step()
    return fedhv_reply(msg, ArrayRecord(model.state_dict()), report, num_examples=len(x))
