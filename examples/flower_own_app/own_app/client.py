"""The app's ClientApp: the report at the received model, then local SGD on Σ wᵢ ℓᵢ."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedhv.flower.strategy import fedhv_reply, task_weights
from own_app.task import TASKS, Net, client_data, task_losses

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    k, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = client_data(k, n)
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    w = task_weights(msg, len(TASKS))
    with torch.no_grad():  # the report: the m task losses at the model the server sent
        report = [float(loss) for loss in task_losses(model, x, y)]
    opt = torch.optim.SGD(model.parameters(), lr=float(context.run_config["lr"]))
    g = torch.Generator().manual_seed(int(msg.content["config"]["server-round"]) * 1000 + k)
    for _ in range(int(context.run_config["local-steps"])):
        batch = torch.randint(len(x), (32,), generator=g)
        losses = task_losses(model, x[batch], {name: t[batch] for name, t in y.items()})
        opt.zero_grad()
        sum(wi * li for wi, li in zip(w, losses)).backward()
        opt.step()
    return fedhv_reply(msg, ArrayRecord(model.state_dict()), report, num_examples=len(x))
