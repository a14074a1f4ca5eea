"""The app's ServerApp: fedhv's FedHVStrategy (or UniformStrategy) in place of FedAvg."""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedhv.flower.strategy import FedHVStrategy, UniformStrategy
from own_app.task import TASKS, Net, metrics, test_data

app = ServerApp()
log = logging.getLogger("own_app")


@app.main()
def main(grid: Grid, context: Context) -> None:
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    log.setLevel(logging.INFO)
    rc = context.run_config
    torch.manual_seed(0)
    model = Net()
    nodes = int(rc["nodes"])
    kind = str(rc["strategy"])
    if kind == "fedhv":
        strategy = FedHVStrategy(len(TASKS), calibration_rounds=int(rc["calibration-rounds"]),
                                 min_available_nodes=nodes, min_train_nodes=nodes)
    else:
        strategy = UniformStrategy(len(TASKS), min_available_nodes=nodes, min_train_nodes=nodes)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=int(rc["num-server-rounds"]))
    model.load_state_dict(result.arrays.to_torch_state_dict())
    if str(rc["out"]):  # the final model, for a plain-PyTorch check
        torch.save(model.state_dict(), str(rc["out"]))
    result_metrics = metrics(model, *test_data(nodes))
    for entry in strategy.history[-3:]:
        log.info("own_app: %s round %d report %s weights %s", entry["phase"], entry["round"],
                 [round(v, 4) for v in entry["report"]], [round(v, 4) for v in entry["weights"]])
    log.info("own_app: %s final test metrics %s", kind, {k: round(v, 4) for k, v in result_metrics.items()})
