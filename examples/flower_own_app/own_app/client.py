"""The app's ClientApp: the report at the received model, then local SGD on Σ wᵢ ℓᵢ; and evaluation."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedhv.experiment.grid_ray import keep_local_ray_on_loopback
from fedhv.flower.strategy import fedhv_evaluate_reply, fedhv_reply, task_weights
from own_app.task import TASKS, Net, client_data, local_update, metrics

# the Simulation Engine loads this module, then starts Ray (no authentication) on every interface: keep it on
# 127.0.0.1 (a no-op when RAY_ADDRESS names another machine's cluster)
keep_local_ray_on_loopback()

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    k, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    report, samples = local_update(model, k, n, task_weights(msg, len(TASKS)),
                                   int(msg.content["config"]["server-round"]), float(context.run_config["lr"]),
                                   int(context.run_config["local-steps"]))
    return fedhv_reply(msg, ArrayRecord(model.state_dict()), report, num_examples=samples)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received model's metrics on this node's data (the server weights them by num-examples)."""
    k, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = client_data(k, n)
    return fedhv_evaluate_reply(msg, metrics(model, x, y), num_examples=len(x))
