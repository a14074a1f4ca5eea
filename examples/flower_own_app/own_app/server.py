"""The app's ServerApp: fedhv's FedHVStrategy (or UniformStrategy) in place of FedAvg.

Its lines go through Flower's logger (``flwr.common.logger.log``), as fedhv's own do, so
``flwr run --stream`` / ``flwr log`` show them next to Flower's."""

from __future__ import annotations

from logging import INFO

import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedhv.flower.strategy import FedHVStrategy, UniformStrategy
from own_app.task import TASKS, Net, metrics, test_data

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    torch.manual_seed(0)
    model = Net()
    nodes = int(rc["nodes"])
    kind = str(rc["strategy"])
    sampling = {"min_available_nodes": nodes, "min_train_nodes": nodes,
                "fraction_evaluate": float(rc["fraction-evaluate"]), "min_evaluate_nodes": 1}
    if kind == "fedhv":
        strategy = FedHVStrategy(len(TASKS), calibration_rounds=int(rc["calibration-rounds"]), **sampling)
    else:
        strategy = UniformStrategy(len(TASKS), **sampling)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=int(rc["num-server-rounds"]))
    model.load_state_dict(result.arrays.to_torch_state_dict())
    if str(rc["out"]):  # the final model, for a plain-PyTorch check
        torch.save(model.state_dict(), str(rc["out"]))
    result_metrics = metrics(model, *test_data(nodes))
    for r in sorted(result.reports)[-3:]:  # the Result carries each round's task weights and report
        log(INFO, "own_app: train round %d report %s weights %s", r, [round(v, 4) for v in result.reports[r]],
            [round(v, 4) for v in result.task_weights[r]])
    for r, evaluated in sorted(result.evaluate_metrics_clientapp.items())[-1:]:
        log(INFO, "own_app: evaluate round %d %s", r, {k: evaluated[k] for k in sorted(evaluated)})
    log(INFO, "own_app: %s final test metrics %s", kind, {k: round(v, 4) for k, v in result_metrics.items()})
