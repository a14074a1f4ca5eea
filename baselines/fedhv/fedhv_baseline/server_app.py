"""The ServerApp: the paper's MultiMNIST model, fedhv's FedHVStrategy (or Uniform), the final test metrics."""

from __future__ import annotations

import json
from logging import INFO

import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedhv_baseline.dataset import load_test
from fedhv_baseline.model import Net, test_metrics
from fedhv_baseline.strategy import make_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    torch.manual_seed(int(rc["seed"]))
    model = Net()
    nodes = int(rc["num-nodes"])  # the federation's SuperNodes (one partition each); the Strategy waits for them
    strategy = make_strategy(rc, nodes)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=int(rc["num-server-rounds"]))
    model.load_state_dict(result.arrays.to_torch_state_dict())
    final = test_metrics(model, *load_test(str(rc["data-dir"]), int(rc["test-samples"])))
    last = max(result.task_weights) if result.task_weights else None
    weights = [round(w, 4) for w in result.task_weights[last]] if last is not None else None
    log(INFO, "fedhv_baseline: %s on %d nodes, final test %s, last task weights %s", rc["strategy"], nodes,
        {k: round(v, 4) for k, v in final.items()}, weights)
    if str(rc["out"]):
        with open(str(rc["out"]), "w", encoding="utf-8") as f:
            json.dump({"strategy": str(rc["strategy"]), "nodes": nodes, "test": final,
                       "task_weights": {str(r): list(w) for r, w in sorted(result.task_weights.items())},
                       "reports": {str(r): list(v) for r, v in sorted(result.reports.items())},
                       "reference": result.reference}, f, indent=1)
